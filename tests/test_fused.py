"""The fused Triton decode step (fastgen_lib/fused/) against the PyTorch ops it replaces. Without CUDA
the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
import copy

import pytest
import torch

# without CUDA, tests/conftest.py has set TRITON_INTERPRET=1 before anything imported triton
triton = pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")

import torch.nn.functional as F  # noqa: E402  (tests/conftest.py patches the interpreter)

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import fused  # noqa: E402
from fastgen_lib.steps import forward, positions  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# float32: IEEE dots, only the summation order differs; bfloat16: one or two output roundings apart
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
DTYPES = [torch.float32, torch.bfloat16]
BATCHES = [1, 3, 32]
TINY = (64, 192)      # GPT-2 tiny: hidden 64 -> qkv 3 * 64
GPT2 = (768, 2304)    # GPT-2 124M's c_attn


def rand(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def linear(K, N, dtype):
    """A Conv1D-like weight [K, N] (outputs of order one) and bias [N]."""
    return rand(K, N, dtype=dtype, scale=K ** -0.5), rand(N, dtype=dtype, scale=0.1)


def close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


# --- the kernels -------------------------------------------------------------------------------------------

def layer_norm(K, dtype):
    ln = torch.nn.LayerNorm(K, device=DEVICE, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(rand(K, dtype=dtype) + 1)
        ln.bias.copy_(rand(K, dtype=dtype))
    return ln


# programs_per_sm 0 never splits K; 64 splits it as far as blocks allow (the last program sums);
# block_k 4096: K is one tile, which a program reads whole (at batch 1: `ONE_TILE`)
SPLITS = [dict(programs_per_sm=0), dict(programs_per_sm=64), dict(block_k=4096)]
SPLIT_IDS = ["no_split", "split", "one_tile"]


@pytest.mark.parametrize("split", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,K,N", [(b, *TINY) for b in BATCHES] + [(1, *GPT2)])
def test_gemv_layer_norm_folded(B, K, N, dtype, split):
    x, ln = rand(B, K, dtype=dtype, scale=3.0) + 1.5, layer_norm(K, dtype)
    W, b = linear(K, N, dtype)
    want = ln(x) @ W + b
    got = fused.gemv(x, W, b, ln=fused.fold_layernorm(ln, W, b), **split)
    close(got, want, dtype)


@pytest.mark.parametrize("split", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", BATCHES)
def test_gemv_layer_norm_gelu(B, dtype, split):
    K, N = 64, 256  # GPT-2 tiny's c_fc
    x, ln = rand(B, K, dtype=dtype), layer_norm(K, dtype)
    W, b = linear(K, N, dtype)
    want = F.gelu(ln(x) @ W + b, approximate="tanh")
    got = fused.gemv(x, W, b, ln=fused.fold_layernorm(ln, W, b), gelu=True, **split)
    close(got, want, dtype)


@pytest.mark.parametrize("split", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,K,N", [(b, 256, 64) for b in BATCHES] + [(1, 3072, 768)])
def test_gemv_bias_residual_in_place(B, K, N, dtype, split):
    x, r = rand(B, K, dtype=dtype), rand(B, N, dtype=dtype)
    W, b = linear(K, N, dtype)
    want = x @ W + b + r
    got = fused.gemv(x, W, b, residual=r, out=r, **split)  # h += ..., as the step
    assert got is r
    close(got, want, dtype)


@pytest.mark.parametrize("split", SPLITS, ids=SPLIT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [3, 32])
def test_gemv_sums_its_result_for_the_next_layer_norm(B, dtype, split):
    # h += m @ W2 + b2 writes h's sums per column tile (stats_out); the GEMV after it takes
    # LayerNorm's mean and 1/std from them (ln_stats) instead of summing h in its loop
    K, E, N = 256, 64, 192
    m, h, ln = rand(B, K, dtype=dtype), rand(B, E, dtype=dtype, scale=2.0) + 1, layer_norm(E, dtype)
    (W2, b2), (W, b) = linear(K, E, dtype), linear(E, N, dtype)
    tiles = -(-E // fused.gemv_tiles(B, K, E, torch.device(DEVICE), dtype=dtype)[1])
    stats = torch.full((tiles, B, 2), float("nan"), device=DEVICE)
    fused.gemv(m, W2, b2, residual=h, out=h, stats_out=stats)
    hf = h.float()
    torch.testing.assert_close(stats.sum(0), torch.stack([hf.sum(1), (hf * hf).sum(1)], 1),
                               rtol=1e-5, atol=1e-4)
    fold = fused.fold_layernorm(ln, W, b)
    got = fused.gemv(h, W, b, ln=fold, ln_stats=stats, **split)
    close(got, fused.gemv(h, W, b, ln=fold, **split), dtype)  # (summed in another order)
    close(got, ln(h) @ W + b, dtype)
    with pytest.raises(AssertionError):  # the sums of another batch
        fused.gemv(h[:2], W, b, ln=fold, ln_stats=stats)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", BATCHES)
def test_gemv_transposed_weight_float32_out(B, dtype):
    # the lm_head: wte [V, E] read as [E, V] (K contiguous), LayerNorm folded, float32 logits
    V, E = 300, 64
    x, ln = rand(B, E, dtype=dtype), layer_norm(E, dtype)
    wte = rand(V, E, dtype=dtype, scale=E ** -0.5)
    want = (ln(x) @ wte.t()).float()
    fold = fused.fold_layernorm(ln, wte.t())
    out = torch.empty(B, V, device=DEVICE)
    got = fused.gemv(x, wte.t(), fold[2], ln=fold, out=out)
    assert got is out
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_gemv_ragged_sizes_strided_rows_and_scratch_reuse():
    # sizes that are no multiple of any block, x a strided view (every other row of a wider tensor),
    # and one scratch (partials, counters) for several split calls: each leaves its counters at 0
    B, K, N = 5, 100, 70
    x = rand(2 * B, K + 3)[::2, :K]
    W, b = linear(K, N, torch.float32)
    scratch = (torch.empty(64 * B * N, device=DEVICE), torch.zeros(fused.LOCKS, dtype=torch.int32,
                                                                 device=DEVICE))
    for _ in range(3):
        r = rand(B, N)
        got = fused.gemv(x, W, b, residual=r, block_n=32, block_k=16, programs_per_sm=64,
                         scratch=scratch)
        close(got, x @ W + b + r, torch.float32)
        assert not scratch[1].any()


@pytest.mark.skipif(not fused.supports_pdl(torch.device(DEVICE)),
                    reason="programmatic dependent launch needs a CUDA GPU of compute capability 9+")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 32])
def test_gemv_chain_with_pdl_equals_without(B, dtype):
    # 40 GEMVs, each reading what the one before wrote (in place, with a residual), replayed as
    # one CUDA graph so that each launch is queued before the kernel ahead ends: as programmatic
    # dependent launches, a kernel that read x too early would give other numbers; the same
    # kernels in the same order give the same bits
    E = 768
    layers = [linear(E, E, dtype) for _ in range(40)]
    x = rand(B, E, dtype=dtype)
    got, want = x.clone(), x.clone()
    scratch = (torch.empty(fused.scratch_size(B, E, E, got.device), device=DEVICE),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device=DEVICE))

    def chain(y, pdl):
        for w, b in layers:
            fused.gemv(y, w, b, residual=y, out=y, scratch=scratch, pdl=pdl)

    chain(x.clone(), True)  # compiles, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(got, True)
    graph.replay()
    chain(want, False)
    assert torch.equal(got, want) and got.isfinite().all()


def test_gemv_splits_k_on_a_small_matrix():
    # a 768-column projection has 12 column tiles: it needs a split to fill the GPU
    assert fused.gemv_tiles(1, 768, 768, torch.device(DEVICE))[3] > 1
    assert fused.gemv_tiles(1, 768, 768, torch.device(DEVICE), programs_per_sm=0)[3] == 1


def test_gemv_split_argument_wins_and_gives_the_same_sums():
    # split=s cuts K into s chunks whatever programs_per_sm says; batch 3 (a padded dot) in
    # 1, 2 and 4 chunks of a 256-row K: the same result as torch within float32 rounding
    torch.manual_seed(0)
    dev = torch.device(DEVICE)
    for s in (1, 2, 4):
        assert fused.gemv_tiles(32, 768, 768, dev, split=s, block_k=64)[3] == s
    x, W, b = torch.randn(3, 256, device=DEVICE), torch.randn(256, 48, device=DEVICE), \
        torch.randn(48, device=DEVICE)
    for s in (1, 2, 4):
        got = fused.gemv(x, W, b, block_n=16, block_k=32, split=s)
        torch.testing.assert_close(got, x @ W + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("B, dtype, block_k, programs_per_sm", [
    (1, torch.float32, 128, 2), (1, torch.bfloat16, 128, 2), (32, torch.float32, 128, 4),
    (32, torch.bfloat16, 128, 2)])
def test_gemv_tiles_by_batch_and_dtype(B, dtype, block_k, programs_per_sm):
    # the default tiles: block_k and the split follow default_tiles; an explicit tile wins
    dev = torch.device(DEVICE)
    assert fused.default_tiles(B, dtype) == (block_k, programs_per_sm)
    bm, bn, bk, split, k_chunk = fused.gemv_tiles(B, 3072, 768, dev, dtype=dtype)
    assert bk == block_k and k_chunk % bk == 0 and split * k_chunk >= 3072
    assert (split, k_chunk) == fused.gemv_tiles(B, 3072, 768, dev, block_k=block_k,
                                                programs_per_sm=programs_per_sm)[3:]
    assert fused.gemv_tiles(B, 3072, 768, dev, block_k=16, dtype=dtype)[2] == 16


def test_batch_32_float32_chunks_are_one_tile_on_an_h200(monkeypatch):
    # so that each program reads its chunk of W before its PDL wait (ONE_TILE), on 132 SMs
    monkeypatch.setattr(fused.tiles, "sm_count", lambda device: 132)
    for K, N in ((768, 2304), (768, 768), (768, 3072), (3072, 768)):
        _, _, bk, split, k_chunk = fused.gemv_tiles(32, K, N, torch.device("cuda"), block_n=64)
        assert k_chunk == bk == 128 and split == K // 128, (K, N)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 3])
def test_gemv_qkv_writes_the_cache_column(B, dtype):
    H, D, L, col = 2, 32, 10, 6
    E = H * D
    x, ln = rand(B, E, dtype=dtype), layer_norm(E, dtype)
    W, b = linear(E, 3 * E, dtype)
    keys, values = torch.zeros(2, B, H, L, D, dtype=dtype, device=DEVICE)
    want = ln(x) @ W + b
    q = fused.gemv(x, W, b, ln=fused.fold_layernorm(ln, W, b), programs_per_sm=64,
                   qkv=(keys, values, torch.tensor(col, device=DEVICE)))
    close(q, want[:, :E], dtype)
    close(keys[:, :, col], want[:, E : 2 * E].view(B, H, D), dtype)
    close(values[:, :, col], want[:, 2 * E :].view(B, H, D), dtype)
    others = [c for c in range(L) if c != col]
    assert not keys[:, :, others].any() and not values[:, :, others].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 3])
def test_gemv_embedding_in_front(B, dtype):
    # layer 0: x = wte[tok] + wpe[pos], LayerNorm'd into the GEMV, and written into x (the residual)
    V, P, E, N = 50, 20, 64, 96
    wte, wpe = rand(V, E, dtype=dtype), rand(P, E, dtype=dtype)
    tok = torch.randint(0, V, (B, 1), device=DEVICE)
    pos = torch.randint(0, P, (B, 1), device=DEVICE)
    ln, (W, b) = layer_norm(E, dtype), linear(E, N, dtype)
    emb = wte[tok[:, 0]] + wpe[pos[:, 0]]
    h = torch.zeros(B, E, dtype=dtype, device=DEVICE)
    got = fused.gemv(h, W, b, ln=fused.fold_layernorm(ln, W, b), embed=(wte, wpe, tok, pos),
                     programs_per_sm=64)
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(h, emb)
    else:  # Triton's CPU interpreter rounds float32 to bfloat16 its own way: one unit apart at most
        torch.testing.assert_close(h, emb, rtol=2**-7, atol=0)
    close(got, ln(emb) @ W + b, dtype)


@pytest.mark.parametrize("B", [1, 3])
def test_gemv_argmax_per_tile(B):
    # each row's largest value per 64-column tile and its first column (ties: the first)
    K, N = 64, 300
    x, (W, b) = rand(B, K), linear(K, N, torch.float32)
    W[:, 70] = W[:, 100] = W[:, 99]  # a tie inside the second tile
    b[70] = b[100] = b[99] = 100.0
    tiles = triton_cdiv(N, 64)
    top = torch.empty(B, tiles, device=DEVICE)
    top_i = torch.empty(B, tiles, dtype=torch.int32, device=DEVICE)
    y = fused.gemv(x, W, b, argmax=(top, top_i), block_n=64)
    for t in range(tiles):
        part = y[:, 64 * t : 64 * t + 64]
        assert torch.equal(top[:, t], part.max(-1).values)
        assert torch.equal(top_i[:, t].long(), part.argmax(-1) + 64 * t)
    assert (top_i[:, 1] == 70).all()


def triton_cdiv(a, b):
    return -(-a // b)


def attention_inputs(B, H, S, D, dtype, pad=None):
    """q [B, H*D], a cache [B, H, S, D] and its mask [B, S]: row i left-padded by `pad[i]` columns,
    the last few slots unused (as a StaticCache longer than the sequence)."""
    q, k, v = rand(B, H * D, dtype=dtype), rand(B, H, S, D, dtype=dtype), rand(B, H, S, D, dtype=dtype)
    pad = pad if pad is not None else [(7 * i) % (S // 2) for i in range(B)]
    cols = torch.arange(S, device=DEVICE)
    mask = (cols[None] >= torch.tensor(pad, device=DEVICE)[:, None]) & (cols[None] < S - 3)
    return q, k, v, mask


def reference_attention(q, k, v, mask, scale=None):
    """SDPA with the boolean mask, in float32 (the kernel's softmax precision) -> [B, H*D]."""
    B, H, S, D = k.shape
    out = F.scaled_dot_product_attention(q.float().view(B, H, 1, D), k.float(), v.float(),
                                         attn_mask=mask[:, None, None], scale=scale)
    return out.reshape(B, H * D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,S,D", [(b, 2, 40, 32) for b in BATCHES] + [(1, 12, 1024, 64)])
def test_attention(B, H, S, D, dtype):
    # split into blocks of keys (flash-decoding), combined by the last program of each row and head
    q, k, v, mask = attention_inputs(B, H, S, D, dtype)
    close(fused.attention(q, k, v, mask), reference_attention(q, k, v, mask).to(dtype), dtype)


def test_attention_one_block():
    q, k, v, mask = attention_inputs(3, 2, 20, 32, torch.float32)
    assert fused.attention_blocks(20)[1] == 1
    close(fused.attention(q, k, v, mask), reference_attention(q, k, v, mask), torch.float32)


def test_attention_reads_only_the_used_slots():
    # with `col`, slots past it are never read: garbage (NaN) there changes nothing
    B, H, S, D, col = 3, 2, 40, 32, 25
    q, k, v, mask = attention_inputs(B, H, S, D, torch.float32)
    mask[:, :] = mask[:, :1] | True
    want = reference_attention(q, k[:, :, : col + 1], v[:, :, : col + 1], mask[:, : col + 1])
    k[:, :, col + 1 :], v[:, :, col + 1 :] = float("nan"), float("nan")
    locks = torch.zeros(B * H, dtype=torch.int32, device=DEVICE)
    scratch = (torch.empty(B * H * 64 * 34, device=DEVICE), locks)
    for _ in range(2):  # the counters are left at 0 for the next call
        got = fused.attention(q, k, v, mask, col=torch.tensor(col, device=DEVICE), block_s=8,
                              scratch=scratch)
        close(got, want, torch.float32)
        assert not locks.any()


@pytest.mark.parametrize("col", [0, 7, 8, 25])  # on a GPU, blocks of 8: a block's last, first
def test_attention_early_kv_reads_the_same(col):
    # early_kv: the slots before `col` read first (before the wait, under PDL), column `col`
    # after: the same result as the default order, here and past the used slots' NaN
    B, H, S, D = 3, 2, 40, 32
    q, k, v, mask = attention_inputs(B, H, S, D, torch.float32)
    mask[:, :] = True
    k[:, :, col + 1 :], v[:, :, col + 1 :] = float("nan"), float("nan")
    c = torch.tensor(col, device=DEVICE)
    want = fused.attention(q, k, v, mask, col=c, block_s=8)
    got = fused.attention(q, k, v, mask, col=c, block_s=8, early_kv=True)
    assert torch.equal(got, want) and got.isfinite().all()
    with pytest.raises(AssertionError, match="early_kv"):
        fused.attention(q, k, v, mask, early_kv=True)


def test_attention_matches_steps_one_query_attention():
    # the eager one_query_attention of steps.py (what GraphStep runs in float32), same inputs
    from fastgen_lib.steps import one_query_attention as eager
    B, H, S, D = 3, 2, 40, 32
    q, k, v, mask = attention_inputs(B, H, S, D, torch.float32)
    want = eager(None, q.view(B, H, 1, D), k, v, mask[:, None, None])[0][:, 0]
    close(fused.attention(q, k, v, mask), want.reshape(B, H * D), torch.float32)


def test_attention_whole_masked_blocks_int_mask_and_explicit_scale():
    # left padding longer than a block (whole blocks of keys masked), an integer mask, a scale
    B, H, S, D = 3, 2, 100, 32
    q, k, v, mask = attention_inputs(B, H, S, D, torch.float32, pad=[0, 40, 90])
    got = fused.attention(q, k, v, mask.long(), scale=0.2, block_s=16)
    close(got, reference_attention(q, k, v, mask, scale=0.2), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,S,D,col,block_s", [(1, 2, 40, 32, 25, 128), (1, 12, 300, 64, 299, 128),
                                                 (3, 2, 40, 32, 0, 16), (2, 2, 40, 32, 37, 8)])
def test_attention_proj_equals_attention_then_gemv(B, H, S, D, col, block_s, dtype):
    # attention and out-projection in one kernel: the attention's output rounded to the dtype, times
    # W, + bias + residual (in place); slots past `col` never read (NaN there), left padding masked,
    # caches of one block and of several (the online softmax), the counters left at 0
    q, k, v, mask = attention_inputs(B, H, S, D, dtype, pad=[(5 * i) % 9 for i in range(B)])
    mask[:, : col + 1] |= torch.arange(col + 1, device=DEVICE) == col  # the step's own slot
    k[:, :, col + 1 :], v[:, :, col + 1 :] = float("nan"), float("nan")
    w, bias = linear(H * D, 96, dtype)
    h = rand(B, 96, dtype=dtype)
    c = torch.tensor(col, device=DEVICE)
    a = fused.attention(q, k, v, mask, c)
    want = (a.float() @ w.float() + bias.float() + h.float()).to(dtype)
    locks = torch.zeros(B * 2, dtype=torch.int32, device=DEVICE)
    scratch = (torch.empty(H * B * 96, device=DEVICE), locks)
    for _ in range(2):
        got = fused.attention_proj(q, k, v, mask, c, w, bias, h.clone(), scratch=scratch,
                                   block_s=block_s)
        close(got, want, dtype)
        assert not locks.any()
    fused.attention_proj(q, k, v, mask, c, w, bias, h, out=h, scratch=scratch, block_s=block_s)
    close(h, want, dtype)


# --- the token choice --------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_eos", [True, False])
def test_greedy_tail_equals_choose_and_decode_steps_writes(use_eos):
    # argmax with ties (the first index wins, as torch.argmax), finished rows padded, EOS finishing a
    # row, the token written at col + 1, positions and the column advanced, done = all finished
    from fastgen_lib.steps import Chooser, GenConfig, choose
    B, V, L, col, eos, pad = 5, 3000, 12, 7, 11, 99
    gen = GenConfig(4, (eos, 13) if use_eos else None, pad)
    chooser = Chooser(gen, torch.device(DEVICE))
    logits = rand(B, V)
    logits[0, [5, 2999]] = 50.0          # a tie: index 5
    logits[1, eos] = 60.0                # finishes on EOS
    logits[2, 13] = 60.0                 # on the other EOS id
    finished = torch.tensor([False, False, False, True, False], device=DEVICE)
    out = torch.zeros(B, L, dtype=torch.long, device=DEVICE)
    tok, pos = torch.zeros(B, 1, dtype=torch.long, device=DEVICE), torch.arange(B, device=DEVICE)
    c, done = torch.tensor(col, device=DEVICE), torch.tensor(True, device=DEVICE)
    want_fin = finished.clone()
    want = choose(logits, want_fin, col + 1, chooser)
    locks = torch.zeros(fused.LOCKS, dtype=torch.int32, device=DEVICE)
    fused.greedy_tail(logits, finished, chooser, out, tok, pos[:, None], c, done, locks,
                      block_v=256)
    assert want[0] == 5 and want[3] == pad
    assert torch.equal(out[:, col + 1], want) and torch.equal(tok[:, 0], want)
    assert torch.equal(finished, want_fin) and int(c) == col + 1 and not bool(done)
    assert torch.equal(pos, torch.arange(B, device=DEVICE) + 1) and not locks.any()
    assert not out[:, : col + 1].any() and not out[:, col + 2 :].any()
    # the same choice from per-tile maxima (as gemv's argmax leaves them), 60 columns a tile
    tiles = logits.view(B, -1, 60)
    top, top_i = tiles.max(-1)
    top_i = (top_i + 60 * torch.arange(tiles.shape[1], device=DEVICE)).int()
    finished.copy_(torch.tensor([False, False, False, True, False]))
    out2 = torch.zeros_like(out)
    fused.greedy_tail(logits, finished, chooser, out2, tok, pos[:, None], c.fill_(col), done,
                      locks, tiles=(top, top_i))
    assert torch.equal(out2[:, col + 1], want)
    finished.fill_(True)
    fused.greedy_tail(logits, finished, chooser, out, tok, pos[:, None], c.fill_(col + 1), done,
                      locks)
    assert bool(done) and int(c) == col + 2 and torch.equal(out[:, col + 2], chooser.pad.expand(B))


# --- the whole decode step of the tiny GPT-2 ---------------------------------------------------------------

@pytest.fixture(scope="module", params=DTYPES, ids=str)
def tiny(request):
    return fg.load_model("tiny", device=DEVICE, dtype=request.param)


def prefilled(model, B, T, L):
    """A StaticCache of L slots prefilled with a left-padded batch (as GraphStep.prefill does), and the
    first step's inputs: tok [B, 1], step_pos [B, 1], mask [B, L] (ones past the prompt)."""
    from transformers import StaticCache
    ids, attn = fg.make_batch(B, T, mixed=True, seed=B + T)
    ids, attn = ids.to(DEVICE), attn.to(DEVICE)
    mask = torch.ones(B, L, dtype=torch.long, device=DEVICE)
    mask[:, :T] = attn
    pos = positions(mask)
    cache = StaticCache(config=model.config, max_cache_len=L)
    logits = forward(model, ids, mask, pos[:, :T], cache)
    return cache, logits.argmax(-1)[:, None], pos, mask


@pytest.mark.parametrize("whole_k", [False, True])
@pytest.mark.parametrize("B", BATCHES)
def test_fused_forward_equals_steps_forward(tiny, B, whole_k, monkeypatch):
    # three decode steps on a prefilled cache: the same float32 logits [B, V] as the model's own step
    # (bfloat16: random-weight logits of order one, a few roundings apart), the same keys and values
    # written at the same column; the fused step leaves the cache's counters alone (`col` is its own)
    T, L, steps = 6, 12, 3
    logits_tol = dict(rtol=1e-4, atol=1e-4) if tiny.dtype == torch.float32 else dict(rtol=0, atol=3e-2)
    if whole_k:  # every GEMV reads its whole K as one tile (`fused.layer_tiles`), from weights
        # with K contiguous (`fused.step_weights`, as at batch 1)
        monkeypatch.setattr(fused.step, "layer_tiles", lambda B, K, N, dtype: dict(block_k=4096))
    cache, tok, pos, mask = prefilled(tiny, B, T, L)
    mine = copy.deepcopy(cache)
    folds, buf = fused.fold_layernorms(tiny), fused.Buffers(tiny, B, L)
    weights = fused.step_weights(tiny, k_contiguous=True) if whole_k else None
    for i in range(steps):
        step_pos = pos[:, T + i : T + i + 1]
        want = forward(tiny, tok, mask, step_pos, cache)
        got = fused.fused_forward(tiny, folds, buf, tok, step_pos, mask, mine,
                                  torch.tensor(T + i, device=DEVICE), weights=weights)
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, **logits_tol)
        for a, b in zip(mine.layers, cache.layers):
            close(a.keys, b.keys, tiny.dtype)
            close(a.values, b.values, tiny.dtype)
            assert int(a.cumulative_length) == T and int(b.cumulative_length) == T + i + 1
        tok = want.argmax(-1)[:, None]


@pytest.mark.parametrize("bias, seed", [(0.6, 4), (0.5, 8)])  # all stop early, apart; most never
@pytest.mark.parametrize("driver", ["every_step", "deferred", "interleaved"])
def test_fused_step_backend_gives_model_generate_tokens(driver, bias, seed):
    # FusedStep on the seam: prefill, warm-up, then the Triton step under each stop driver (on a CPU,
    # under the interpreter), equal to model.generate with left padding and rows that stop apart
    from fastgen_lib import decoders, stops
    from fastgen_lib.models import EOS
    from fastgen_lib.reference import hf_generate
    from fastgen_lib.steps import GenConfig
    model = fg.load_model("tiny", device=DEVICE)
    fg.set_eos_bias(model, bias)
    ids, mask = fg.make_batch(4, 8, mixed=True, seed=seed, device=DEVICE)
    N = 24
    ref = hf_generate(model, ids, mask, N, EOS, EOS, cache_implementation="static")
    stop = [int((r == EOS).nonzero()[0]) if (r == EOS).any() else None for r in ref[:, 8:]]
    assert len(set(stop)) >= 2  # the case has rows that stop at different steps (or never)
    gen = GenConfig(N, (EOS,), EOS, False, 1.0, None, 0, None)
    out = decoders.decode(model, ids, mask, gen, fused.FusedStep, getattr(stops, driver))
    assert torch.equal(out, ref), (out, ref)


def test_step_weights_are_k_contiguous_copies_refreshed_in_place():
    # at batch 1 the layer GEMVs read copies with K contiguous: the same values, strides (1, K);
    # out= writes new values into the same tensors (the graphs' addresses); at batch > 1, the
    # model's own tensors
    model = fg.load_model("tiny", device=DEVICE)
    own = fused.step_weights(model, k_contiguous=False)
    copies = fused.step_weights(model, k_contiguous=True)
    assert len(copies) == len(own) == model.config.n_layer
    for ws, cs, block in zip(own, copies, model.transformer.h):
        assert ws[0] is block.attn.c_attn.weight and ws[2] is block.mlp.c_proj.weight
        for w, c in zip(ws, cs):
            assert c.shape == w.shape and c.stride() == (1, w.shape[0]) and torch.equal(c, w)
            assert c.data_ptr() != w.data_ptr()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(2.0)
    addresses = [c.data_ptr() for cs in copies for c in cs]
    assert fused.step_weights(model, True, out=copies) is copies
    assert [c.data_ptr() for cs in copies for c in cs] == addresses
    assert torch.equal(copies[1][1], model.transformer.h[1].mlp.c_fc.weight)


@pytest.mark.parametrize("B", [4, 1])  # batch 1: the step's weights are copies too
def test_fused_step_folds_again_after_a_weight_changes_in_place(B):
    # the folds (c = g @ W, d = beta @ W + b) and, at batch 1, the step's weights are copies: a
    # kept step must see `lm_head.bias` and a layer's weight written in place (no new address,
    # so the same step and graphs), as GraphStep's graphs do
    from fastgen_lib import decoders, stops
    from fastgen_lib.models import EOS
    from fastgen_lib.reference import hf_generate
    from fastgen_lib.steps import GenConfig
    model = fg.load_model("tiny", device=DEVICE)
    fg.set_eos_bias(model, 0.01)
    ids, mask = fg.make_batch(B, 8, mixed=True, seed=4, device=DEVICE)
    N = 24
    decoders.decode(model, ids, mask, GenConfig(2, (EOS,), EOS, max_cache_len=8 + N),
                    fused.FusedStep, stops.deferred)  # makes the step, folds a bias of 0.01
    with torch.no_grad():
        model.lm_head.bias[EOS] = 0.6  # rows now stop apart (the test above)
        model.transformer.h[0].mlp.c_fc.weight.mul_(1.5)
    ref = hf_generate(model, ids, mask, N, EOS, EOS, cache_implementation="static")
    out = decoders.decode(model, ids, mask, GenConfig(N, (EOS,), EOS), fused.FusedStep,
                          stops.deferred)
    assert len(model.__dict__["_fastgen_steps"]) == 1  # the same step, folded again
    assert torch.equal(out, ref), (out, ref)


def test_fused_step_samples_as_the_other_decoders():
    # sampling goes through steps.choose (the same Gumbel noise per seed and step): the fused step
    # draws the eager static-cache decoder's tokens
    from fastgen_lib import decoders, stops
    from fastgen_lib.models import EOS
    from fastgen_lib.steps import GenConfig, StaticStep
    model = fg.load_model("tiny", device=DEVICE)
    ids, mask = fg.make_batch(3, 8, mixed=True, seed=1, device=DEVICE)
    gen = GenConfig(12, (EOS,), EOS, True, 0.8, 20, 7, None)
    want = decoders.decode(model, ids, mask, gen, StaticStep, stops.every_step)
    got = decoders.decode(model, ids, mask, gen, fused.FusedStep, stops.deferred)
    assert torch.equal(got, want), (got, want)


def test_fused_step_refuses_another_model_type():
    from transformers import LlamaConfig, LlamaForCausalLM
    from fastgen_lib.steps import GenConfig
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="GPT-2"):
        fused.FusedStep(model, 1, 8, GenConfig(4, None, 0))


# --- the loop on the GPU (gpu_loop.py): what can be checked without one ----------------------------

def test_gpu_loop_refuses_a_cpu_sampling_and_streaming():
    # its graph needs CUDA 12.4 conditional nodes; its body must allocate nothing (greedy fused)
    from fastgen_lib import decoders
    from fastgen_lib.gpu_loop import gpu_loop
    from fastgen_lib.models import EOS
    from fastgen_lib.steps import GenConfig
    model = fg.load_model("tiny", device=DEVICE)
    ids, mask = fg.make_batch(2, 6, mixed=True, seed=3, device=DEVICE)
    sampled = GenConfig(4, (EOS,), EOS, True, 1.0, None, 0, None)
    with pytest.raises(ValueError, match="greedy"):
        decoders.decode(model, ids, mask, sampled, fused.FusedStep, gpu_loop)
    with pytest.raises(ValueError, match="cannot stream"):
        gpu_loop(None, 4, streamer=object())
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            fg.generate(model, ids, mask, decoder="gpu_loop", max_new_tokens=4)


def test_fused_step_at_batch_1_joins_attention_and_c_proj(monkeypatch):
    # at batch 1 each layer's attention and c_proj are one kernel (`attention_proj`; `attention`
    # never runs), with model.generate's tokens (rows that stop apart: the tests above, batch 4)
    from fastgen_lib import decoders, stops
    from fastgen_lib.models import EOS
    from fastgen_lib.reference import hf_generate
    from fastgen_lib.steps import GenConfig
    calls = {"attention": 0, "attention_proj": 0}

    def spy(name):
        real = getattr(fused, name)

        def counted(*args, **kw):
            calls[name] += 1
            return real(*args, **kw)
        return counted

    for name in calls:
        monkeypatch.setattr(fused.step, name, spy(name))
    model = fg.load_model("tiny", device=DEVICE)
    ids, mask = fg.make_batch(1, 8, seed=3, device=DEVICE)
    N = 16
    ref = hf_generate(model, ids, mask, N, EOS, EOS, cache_implementation="static")
    gen = GenConfig(N, (EOS,), EOS, False, 1.0, None, 0, None)
    out = decoders.decode(model, ids, mask, gen, fused.FusedStep, stops.interleaved)
    assert out.shape == (1, 8 + N) and torch.equal(out, ref), (out, ref)
    assert calls["attention"] == 0 and calls["attention_proj"] > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_tiles_whole_k_at_batch_1_only_where_the_tile_fits(dtype):
    # GPT-2 124M's layer GEMVs at batch 1: all of K one tile (no split), 8 columns (4 for
    # mlp.c_proj); batch 32, and a mlp.c_proj of K = 16384 (4 columns of 16384 rows: 128 KB
    # in bfloat16, 256 KB in float32, over 128 KB in float32 only) keep gemv's split
    f32 = dtype == torch.float32
    for K, N in [(768, 2304), (768, 768), (768, 3072), (3072, 768)]:
        tiles = fused.layer_tiles(1, K, N, dtype)
        on_gpu = 4 if K > 1024 else 8  # the interpreter's: ~4 column tiles
        want = max(on_gpu, triton.next_power_of_2(N // 4)) if fused.INTERPRET else on_gpu
        assert tiles["block_k"] >= K and tiles["block_n"] == want
        assert fused.gemv_tiles(1, K, N, torch.device(DEVICE), block_n=tiles["block_n"],
                                block_k=tiles["block_k"], dtype=dtype)[3] == 1  # split 1
        assert fused.layer_tiles(32, K, N, dtype) == {}
    assert (fused.layer_tiles(1, 16384, 4096, dtype) == {}) == f32

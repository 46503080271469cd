"""The fused Triton decode step (fastgen_lib/fused.py) against the PyTorch ops it replaces. Without CUDA
the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton is imported)."""
import copy

import pytest
import torch

# without CUDA, tests/conftest.py has set TRITON_INTERPRET=1 before anything imported triton
pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")

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

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,K,N", [(b, *TINY) for b in BATCHES] + [(1, *GPT2)])
def test_ln_gemv(B, K, N, dtype):
    x, lw, lb = rand(B, K, dtype=dtype, scale=3.0), rand(K, dtype=dtype), rand(K, dtype=dtype)
    W, b = linear(K, N, dtype)
    want = F.layer_norm(x, (K,), lw, lb, 1e-5) @ W + b
    close(fused.ln_gemv(x, lw, lb, 1e-5, W, b), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", BATCHES)
def test_ln_gemv_gelu(B, dtype):
    K, N = 64, 256  # GPT-2 tiny's c_fc
    x, lw, lb = rand(B, K, dtype=dtype), rand(K, dtype=dtype), rand(K, dtype=dtype)
    W, b = linear(K, N, dtype)
    want = F.gelu(F.layer_norm(x, (K,), lw, lb, 1e-5) @ W + b, approximate="tanh")
    close(fused.ln_gemv(x, lw, lb, 1e-5, W, b, gelu=True), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,K,N", [(b, 256, 64) for b in BATCHES] + [(1, *GPT2)])
def test_gemv_bias_residual(B, K, N, dtype):
    x, r = rand(B, K, dtype=dtype), rand(B, N, dtype=dtype)
    W, b = linear(K, N, dtype)
    close(fused.gemv_bias_residual(x, W, b, r), x @ W + b + r, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,K,N", [(b, 64, 256) for b in BATCHES] + [(1, 768, 3072)])
def test_gemv_bias_gelu(B, K, N, dtype):
    x = rand(B, K, dtype=dtype)
    W, b = linear(K, N, dtype)
    close(fused.gemv_bias_gelu(x, W, b), F.gelu(x @ W + b, approximate="tanh"), dtype)


def test_gemv_ragged_sizes_and_strided_rows():
    # sizes that are no multiple of any block, and x a strided view (every other row of a wider tensor)
    B, K, N = 5, 100, 70
    x = rand(2 * B, K + 3)[::2, :K]
    r = rand(B, N)
    W, b = linear(K, N, torch.float32)
    close(fused.gemv_bias_residual(x, W, b, r, block_n=32, block_k=32), x @ W + b + r, torch.float32)


def attention_inputs(B, H, S, D, dtype, pad=None):
    """q [B, H, D], a cache [B, H, S, D] and its mask [B, S]: row i left-padded by `pad[i]` columns,
    the last few slots unused (as a StaticCache longer than the sequence)."""
    q, k, v = rand(B, H, D, dtype=dtype), rand(B, H, S, D, dtype=dtype), rand(B, H, S, D, dtype=dtype)
    pad = pad if pad is not None else [(7 * i) % (S // 2) for i in range(B)]
    cols = torch.arange(S, device=DEVICE)
    mask = (cols[None] >= torch.tensor(pad, device=DEVICE)[:, None]) & (cols[None] < S - 3)
    return q, k, v, mask


def reference_attention(q, k, v, mask):
    """SDPA with the boolean mask, in float32 (the kernel's softmax precision)."""
    out = F.scaled_dot_product_attention(q.float()[:, :, None], k.float(), v.float(),
                                         attn_mask=mask[:, None, None])
    return out[:, :, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,S,D", [(b, 2, 40, 32) for b in BATCHES] + [(1, 12, 1024, 64)])
def test_one_query_attention(B, H, S, D, dtype):
    q, k, v, mask = attention_inputs(B, H, S, D, dtype)
    close(fused.one_query_attention(q, k, v, mask), reference_attention(q, k, v, mask), dtype)


def test_attention_matches_steps_one_query_attention():
    # the eager one_query_attention of steps.py (what GraphStep runs in float32), same inputs
    from fastgen_lib.steps import one_query_attention as eager
    q, k, v, mask = attention_inputs(3, 2, 40, 32, torch.float32)
    want = eager(None, q[:, :, None], k, v, mask[:, None, None])[0][:, 0]
    close(fused.one_query_attention(q, k, v, mask), want, torch.float32)


def test_attention_whole_masked_blocks_int_mask_and_strided_q():
    # left padding longer than a block (whole blocks of keys masked), an integer mask, q a view into a
    # qkv row [B, 3 * H * D] (as fused_forward passes it), an explicit scale
    B, H, S, D = 3, 2, 100, 32
    q, k, v, mask = attention_inputs(B, H, S, D, torch.float32, pad=[0, 40, 90])
    qkv = torch.cat([q.reshape(B, H * D), rand(B, 2 * H * D)], dim=1)
    q_view = qkv[:, : H * D].view(B, H, D)
    got = fused.one_query_attention(q_view, k, v, mask.long(), scale=0.2, block_s=16)
    want = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask[:, None, None], scale=0.2)
    close(got, want[:, :, 0], torch.float32)


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


@pytest.mark.parametrize("B", BATCHES)
def test_fused_forward_equals_steps_forward(tiny, B):
    # three decode steps on a prefilled cache: the same float32 logits [B, V] as the model's own step
    # (bfloat16: random-weight logits of order one, a few roundings apart), the same keys and values
    # written at the same column, and the cache's column advanced alike
    T, L, steps = 6, 12, 3
    logits_tol = dict(rtol=1e-4, atol=1e-4) if tiny.dtype == torch.float32 else dict(rtol=0, atol=3e-2)
    cache, tok, pos, mask = prefilled(tiny, B, T, L)
    mine = copy.deepcopy(cache)
    for i in range(steps):
        step_pos = pos[:, T + i : T + i + 1]
        want = forward(tiny, tok, mask, step_pos, cache)
        got = fused.fused_forward(tiny, tok, step_pos, mask, mine)
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, **logits_tol)
        for a, b in zip(mine.layers, cache.layers):
            close(a.keys, b.keys, tiny.dtype)
            close(a.values, b.values, tiny.dtype)
            assert int(a.cumulative_length) == int(b.cumulative_length) == T + i + 1
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


def test_fused_step_refuses_another_model_type():
    from transformers import LlamaConfig, LlamaForCausalLM
    from fastgen_lib.steps import GenConfig
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="GPT-2"):
        fused.FusedStep(model, 1, 8, GenConfig(4, None, 0))

"""A fused GPT-2 decode step in Triton (issue 14 groundwork): one new token per row, B rows (1..32), a
StaticCache of L slots. Per layer, five kernels (gpt-fast style: small, shapes in comments):

    qkv = ln_gemv(h, ln_1, c_attn)                     LayerNorm fused into x @ W + b     [B, 3E]
    (torch glue: k, v into the cache at the step's column)
    a   = one_query_attention(q, K, V, mask)           one query per (row, head)          [B, H, D]
    h   = gemv_bias_residual(a, c_proj, h)             x @ W + b + residual               [B, E]
    m   = ln_gemv(h, ln_2, c_fc, gelu=True)            LayerNorm, x @ W + b, GELU (tanh)  [B, 4E]
    h   = gemv_bias_residual(m, mlp.c_proj, h)                                            [B, E]

`fused_forward` chains them for GPT2LMHeadModel (embeddings, final LayerNorm and lm_head stay in torch);
`FusedStep` is the step backend on the seam (`decoders.decode(..., FusedStep, stops.interleaved)`).
Every kernel takes float32 or bfloat16 and accumulates in float32 (float32 dots in IEEE precision, never
TF32, so float32 logits match the eager model's).
Off CUDA, set TRITON_INTERPRET=1 before importing triton: the kernels then run on CPU tensors.
"""
import math
import os

import torch
import triton
import triton.language as tl

from .steps import GraphStep, choose

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # kernels run on the CPU (numpy)
SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2.0 / math.pi))  # a global a kernel reads: constexpr




# --- x @ W + b, with an optional LayerNorm before, GELU or a residual after -------------------------------

@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, lnw_ptr, lnb_ptr,
                 B, K, N, eps,
                 stride_xb, stride_wk, stride_wn, stride_rb, stride_yb,
                 HAS_LN: tl.constexpr, GELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, DOT_F32: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # x [B, K], W [K, N] (Conv1D's layout: [in, out]), b [N], residual [B, N] -> y [B, N].
    # Program (n, m) computes the tile y[m*BLOCK_M : +BLOCK_M, n*BLOCK_N : +BLOCK_N], looping over K.
    # With HAS_LN, x is first LayerNorm'd over K (weight lnw [K], bias lnb [K]): each program recomputes
    # its rows' mean and variance (B*K reads, cheap next to the K*BLOCK_N weights it streams).
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                         # [BLOCK_M]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                         # [BLOCK_N]
    row_ok = rows < B
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None] * stride_xb                             # [BLOCK_M, 1]

    if HAS_LN:
        # two passes over x, as torch's layer_norm: the mean, then the variance around it (float32)
        acc_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & (ks[None, :] < K), other=0.0)
            acc_sum += tl.sum(x.to(tl.float32), axis=1)
        mean = acc_sum / K                                                 # [BLOCK_M]
        acc_var = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (ks[None, :] < K)
            x = tl.load(x_rows + ks[None, :], mask=ok, other=0.0).to(tl.float32)
            d = tl.where(ok, x - mean[:, None], 0.0)
            acc_var += tl.sum(d * d, axis=1)
        rstd = 1.0 / tl.sqrt(acc_var / K + eps)                            # [BLOCK_M]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)                                    # [BLOCK_K]
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if HAS_LN:
            lnw = tl.load(lnw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            lnb = tl.load(lnb_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            xn = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * lnw[None, :] + lnb[None, :]
            x = xn.to(w_ptr.dtype.element_ty)  # rounded like the model's LayerNorm output (bfloat16)
        w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)       # [BLOCK_K, BLOCK_N]
        if DOT_F32:  # the CPU interpreter's dot multiplies bfloat16's raw bits: upcast (exact products)
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, w, acc, input_precision="ieee")                    # [BLOCK_M, BLOCK_N] float32

    acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GELU:
        # GPT-2's gelu_new: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
        # and 1 + tanh(u) = 2 sigmoid(2u)
        u = SQRT_2_OVER_PI * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * u)
    out_ok = row_ok[:, None] & col_ok[None, :]
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + rows[:, None] * stride_rb + cols[None, :], mask=out_ok, other=0.0)
        acc += r.to(tl.float32)
    tl.store(y_ptr + rows[:, None] * stride_yb + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_ok)


def _gemv(x, weight, bias, residual=None, ln_weight=None, ln_bias=None, eps=1e-5, gelu=False,
          block_n=None, block_k=128, num_warps=None):
    """x [B, K] @ weight [K, N] + bias [N] (then GELU, or + residual [B, N]) -> a new [B, N] in x's dtype;
    with ln_weight/ln_bias [K], x is LayerNorm'd (eps) first. Rows and the weight may be strided views
    (the last dimension of x, residual and bias contiguous)."""
    B, K = x.shape
    K2, N = weight.shape
    assert K == K2 and bias.shape == (N,), (x.shape, weight.shape, bias.shape)
    assert x.stride(-1) == 1 and bias.is_contiguous()
    y = torch.empty(B, N, dtype=x.dtype, device=x.device)
    r = residual if residual is not None else y  # (unread without HAS_RESIDUAL)
    if residual is not None:
        assert residual.shape == (B, N) and residual.stride(-1) == 1
    lnw = ln_weight if ln_weight is not None else bias  # (unread without HAS_LN)
    lnb = ln_bias if ln_bias is not None else bias
    block_m = 16 if B <= 16 else 32  # tl.dot wants every side >= 16: rows past B are masked
    # tiles from tools/tune_fused.py (results/h200/fused/tune.csv): narrow column tiles at small
    # batch, so that even a 768-column projection spreads over 48 programs
    if block_n is None:
        block_n = 16 if B <= 16 else 64 if weight.dtype == torch.float32 else 32
    if num_warps is None:
        num_warps = 4 if B <= 16 else 8
    grid = (triton.cdiv(N, block_n), triton.cdiv(B, block_m))
    _gemv_kernel[grid](x, weight, bias, r, y, lnw, lnb, B, K, N, eps,
                       x.stride(0), weight.stride(0), weight.stride(1), r.stride(0), y.stride(0),
                       HAS_LN=ln_weight is not None, GELU=gelu, HAS_RESIDUAL=residual is not None,
                       DOT_F32=INTERPRET and weight.dtype != torch.float32,
                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps)
    return y


def ln_gemv(x, ln_weight, ln_bias, eps, weight, bias, gelu=False, **blocks):
    """layer_norm(x [B, K], (K,), ln_weight, ln_bias, eps) @ weight [K, N] + bias [N] -> [B, N]
    (GELU after, tanh approximation, with gelu=True: GPT-2's MLP input)."""
    return _gemv(x, weight, bias, ln_weight=ln_weight, ln_bias=ln_bias, eps=eps, gelu=gelu, **blocks)


def gemv_bias_residual(x, weight, bias, residual, **blocks):
    """x [B, K] @ weight [K, N] + bias [N] + residual [B, N] -> [B, N]."""
    return _gemv(x, weight, bias, residual=residual, **blocks)


def gemv_bias_gelu(x, weight, bias, **blocks):
    """gelu_tanh(x [B, K] @ weight [K, N] + bias [N]) -> [B, N]."""
    return _gemv(x, weight, bias, gelu=True, **blocks)


# --- attention of one query token over the whole static cache ---------------------------------------------

@triton.jit
def _one_query_attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr,
                                H, S, D, scale,
                                stride_qb, stride_qh,
                                stride_kb, stride_kh, stride_ks,
                                stride_vb, stride_vh, stride_vs,
                                stride_mb, stride_ob, stride_oh,
                                BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # q [B, H, D], K/V [B, H, S, D] (the cache), mask [B, S] (nonzero = attend) -> o [B, H, D].
    # One program per (b, h): an online softmax (float32) over S in blocks of BLOCK_S keys.
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    ds = tl.arange(0, BLOCK_D)
    d_ok = ds < D
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + ds, mask=d_ok, other=0.0).to(tl.float32)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    m_i = tl.full([], -1.0e30, tl.float32)  # running max: finite, so an all-masked block gives 0, not NaN
    l_i = tl.full([], 0.0, tl.float32)      # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, S, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)                                    # [BLOCK_S]
        s_ok = ss < S
        keep = (tl.load(m_ptr + b * stride_mb + ss, mask=s_ok, other=0) != 0) & s_ok
        kv_ok = s_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + ss[:, None] * stride_ks + ds[None, :], mask=kv_ok, other=0.0)
        scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale     # [BLOCK_S]
        scores = tl.where(keep, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(keep, tl.exp(scores - m_new), 0.0)                   # [BLOCK_S]
        v = tl.load(v_base + ss[:, None] * stride_vs + ds[None, :], mask=kv_ok, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)  # [BLOCK_D]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i  # a row with no key to attend gives NaN, as softmax over all -inf does
    tl.store(o_ptr + b * stride_ob + h * stride_oh + ds, out.to(o_ptr.dtype.element_ty), mask=d_ok)


def one_query_attention(q, keys, values, mask, scale=None, block_s=64):
    """softmax(q . K^T * scale, masked) @ V for one query token per row and head: q [B, H, D],
    keys/values [B, H, S, D], mask [B, S] (bool or int, True/nonzero = attend; left padding and unused
    cache slots False) -> a new [B, H, D] in values' dtype. scale defaults to D ** -0.5."""
    B, H, D = q.shape
    S = keys.shape[2]
    assert keys.shape == values.shape == (B, H, S, D) and mask.shape == (B, S), \
        (q.shape, keys.shape, values.shape, mask.shape)
    assert q.stride(-1) == keys.stride(-1) == values.stride(-1) == 1
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes, no copy
    assert mask.stride(-1) == 1
    scale = D ** -0.5 if scale is None else scale
    o = torch.empty(B, H, D, dtype=values.dtype, device=values.device)
    _one_query_attention_kernel[(B * H,)](
        q, keys, values, mask, o, H, S, D, scale,
        q.stride(0), q.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        mask.stride(0), o.stride(0), o.stride(1),
        BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(D))
    return o


# --- GPT-2's decode step from these kernels ----------------------------------------------------------------

def step_mask(mask, col):
    """The keys the step's query attends to, bool [B, L]: `mask` [B, L] (prompt padding 0) and the
    columns up to the step's own `col` (0-d tensor), as the causal mask over a static cache does."""
    L = mask.shape[1]
    return (mask != 0) & (torch.arange(L, device=mask.device) <= col)


@torch.no_grad()
def fused_forward(model, tok, step_pos, mask, cache):
    """One decode step of GPT2LMHeadModel with the fused kernels: tok [B, 1] token ids, step_pos [B, 1]
    their position ids, mask [B, L] the attention mask over all L slots of the prefilled StaticCache
    `cache`. Writes the step's keys/values at the cache's next column (and advances it, as
    `steps.forward` does) -> float32 logits [B, V], equal to
    `steps.forward(model, tok, mask, step_pos, cache)`.
    Torch glue: the embeddings, the cache write, the final LayerNorm and the lm_head."""
    tr = model.transformer
    B = tok.shape[0]
    E, H = model.config.n_embd, model.config.n_head
    D = E // H
    eps = model.config.layer_norm_epsilon
    col = cache.layers[0].cumulative_length.clone()  # 0-d: the column this step writes (each layer's
                                                     # own counter advances below)
    keep = step_mask(mask, col)                       # [B, L] bool
    h = tr.wte.weight[tok[:, 0]] + tr.wpe.weight[step_pos[:, 0]]               # [B, E]
    for block, layer in zip(tr.h, cache.layers):
        at, mlp = block.attn, block.mlp
        qkv = ln_gemv(h, block.ln_1.weight, block.ln_1.bias, eps,
                      at.c_attn.weight, at.c_attn.bias)                         # [B, 3E]
        q, k, v = (t.view(B, H, D) for t in qkv.split(E, dim=1))                # [B, H, D] each (views)
        layer.keys.index_copy_(2, col.view(1), k[:, :, None])                   # cache [B, H, L, D]
        layer.values.index_copy_(2, col.view(1), v[:, :, None])
        layer.cumulative_length.add_(1)
        a = one_query_attention(q, layer.keys, layer.values, keep)             # [B, H, D]
        h = gemv_bias_residual(a.view(B, E), at.c_proj.weight, at.c_proj.bias, h)               # [B, E]
        m = ln_gemv(h, block.ln_2.weight, block.ln_2.bias, eps,
                    mlp.c_fc.weight, mlp.c_fc.bias, gelu=True)                  # [B, 4E]
        h = gemv_bias_residual(m, mlp.c_proj.weight, mlp.c_proj.bias, h)        # [B, E]
    h = torch.nn.functional.layer_norm(h, (E,), tr.ln_f.weight, tr.ln_f.bias, eps)
    return model.lm_head(h).float()                                             # [B, V]


# --- the step backend on the seam (steps.GraphStep with this forward) ----------------------------------------

def fused_decode_step(model, cache, chooser, tok, step_pos, mask, col, finished, out, done):
    """`steps.decode_step` with `fused_forward` in place of the model's forward: choose the next token,
    write it into `out` at column `col` and into `tok`, advance the position, set `done`. In place
    only, so it replays as a CUDA graph (not compiled: the kernels are Triton's already)."""
    col += 1
    logits = fused_forward(model, tok, step_pos, mask, cache)
    nxt = choose(logits, finished, col, chooser)
    out.index_copy_(1, col.view(1), nxt[:, None])
    tok.copy_(nxt[:, None])
    step_pos += 1
    done.copy_(finished.all())


class FusedStep(GraphStep):
    """A GraphStep whose step is `fused_decode_step`: the same buffers, StaticCache, eager prefill,
    warm-up and one CUDA graph per flag slot; any stop driver drives it. GPT-2 only (GPT2LMHeadModel)."""

    def __init__(self, model, batch, length, gen):
        if getattr(model.config, "model_type", None) != "gpt2":
            raise ValueError(f"the fused step runs GPT-2 (GPT2LMHeadModel), not "
                             f"{getattr(model.config, 'model_type', type(model).__name__)}")
        if model.device.type != "cuda" and not INTERPRET:
            raise ValueError("the fused step needs a CUDA GPU with Triton (on a CPU, only under "
                             "Triton's interpreter: TRITON_INTERPRET=1 before triton is imported)")
        super().__init__(model, batch, length, gen)

    def run(self, slot):
        fused_decode_step(self.model, self.cache, self.chooser, self.tok, self.step_pos, self.mask,
                          self.col, self.finished, self.out, self.done[slot])

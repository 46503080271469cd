"""Issue 14, the next step after tools/probe_chain.py: the MLPs of GPT-2's 12 layers at batch 1 as
ONE persistent kernel, against the library's 24 GEMV kernels (`fused.gemv`, split K, a counter per
column tile, programmatic dependent launches) doing the same work in one CUDA graph.

The persistent kernel runs one program per SM. Its phases are the GEMVs, c_fc (LayerNorm folded
in, GELU) then mlp.c_proj (+ bias + residual, in place), layer after layer; between phases its
programs meet at a grid-wide barrier (an atomic count and a spin). A phase splits nothing along K:
each program takes whole column tiles (`block_n` columns, all of K) in turn, so no partial sums
and no counters per tile; it reads its input with `.cg` (from L2: other SMs wrote it in the phase
before). Under Triton's CPU interpreter, which runs one program at a time (a spin would never end),
the same kernel is launched once per phase (`phases` of one): the tests check the phases' math
there, and the barrier on a GPU.

  python tools/probe_persistent.py OUT_CSV     (GPU) us per chain of 12 MLPs (`step_ab.bench_graph`:
      one CUDA graph, L2 flushed before each replay), each config, both dtypes
"""
import sys

import torch
import triton
import triton.language as tl

from fastgen_lib import fused

SQRT_2_OVER_PI = fused.SQRT_2_OVER_PI


@triton.jit
def _gemv_phase(x_ptr, w_ptr, b_ptr, y_ptr, g_ptr, c_ptr, pid, P, K, N, eps,
                stride_wk, stride_wn, LN: tl.constexpr, GELU: tl.constexpr,
                RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[cols] = x @ W[:, cols] + b (x LayerNorm'd first with LN, folded as `fused.gemv` does:
    g, c, and b = d), then GELU, or + y[cols] (the residual, in place), for the column tiles
    pid, pid + P, ...: each tile over the whole of K, by one program, so nothing to add up later."""
    for t in range(pid, tl.cdiv(N, BLOCK_N), P):
        cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
        s1 = tl.zeros([BLOCK_K], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            x = tl.load(x_ptr + ks, mask=k_ok, other=0.0, cache_modifier=".cg")
            if LN:  # x * g, rounded to W's dtype as `fused.gemv` does; mean and 1/std after
                xf = x.to(tl.float32)
                s1 += xf
                s2 += xf * xf
                x = (xf * tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)).to(
                    w_ptr.dtype.element_ty)
            acc += x.to(tl.float32)[:, None] * w.to(tl.float32)
        out = tl.sum(acc, axis=0)                                          # [BLOCK_N]
        if LN:
            mean = tl.sum(s1, axis=0) / K
            rstd = 1.0 / tl.sqrt(tl.maximum(tl.sum(s2, axis=0) / K - mean * mean, 0.0) + eps)
            out = rstd * (out - mean * tl.load(c_ptr + cols, mask=col_ok, other=0.0))
        out += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if GELU:
            out = out * tl.sigmoid(2.0 * SQRT_2_OVER_PI * (out + 0.044715 * out * out * out))
        if RESIDUAL:  # y is the residual: each element read, then written, by this program only
            out += tl.load(y_ptr + cols, mask=col_ok, other=0.0, cache_modifier=".cg").to(
                tl.float32)
        tl.store(y_ptr + cols, out.to(y_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _mlp_chain_kernel(h_ptr, m_ptr, w1_ptr, g_ptr, c_ptr, d_ptr, w2_ptr, b2_ptr, cnt_ptr,
                      E, F, eps, PHASE_LO, PHASE_HI,
                      BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr):
    # h [E] += gelu(LN(h) @ W1[l] + b1[l]) @ W2[l] + b2[l] for the layers of phases
    # PHASE_LO..PHASE_HI (2 l: c_fc into m [F], 2 l + 1: mlp.c_proj into h); W1 [L, E, F],
    # W2 [L, F, E], the folds g [L, E], c and d [L, F], b2 [L, E]; cnt: 2 int32 zeros.
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    for ph in range(PHASE_LO, PHASE_HI):
        layer = ph // 2
        if ph % 2 == 0:
            _gemv_phase(h_ptr, w1_ptr + layer * E * F, d_ptr + layer * F, m_ptr,
                        g_ptr + layer * E, c_ptr + layer * F, pid, P, E, F, eps, F, 1,
                        LN=True, GELU=True, RESIDUAL=False, BLOCK_N=BLOCK_N1, BLOCK_K=BLOCK_K)
        else:
            _gemv_phase(m_ptr, w2_ptr + layer * F * E, b2_ptr + layer * E, h_ptr,
                        g_ptr, c_ptr, pid, P, F, E, eps, E, 1,
                        LN=False, GELU=False, RESIDUAL=True, BLOCK_N=BLOCK_N2, BLOCK_K=BLOCK_K)
        if ph + 1 < PHASE_HI:  # a grid-wide barrier: every program's writes before any reads
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
            while seen < (ph + 1 - PHASE_LO) * P:
                seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel") == P - 1:  # the last one out resets
        tl.atomic_xchg(cnt_ptr, 0)
        tl.atomic_xchg(cnt_ptr + 1, 0)


class MLPs:
    """The MLPs of GPT2LMHeadModel `model`'s layers, stacked for the persistent kernel (W1, W2,
    the LayerNorm folds, b2), and the pieces `fused.gemv` takes for the same chain."""

    def __init__(self, model):
        blocks = model.transformer.h
        self.folds = [fused.fold_layernorm(b.ln_2, b.mlp.c_fc.weight, b.mlp.c_fc.bias)
                      for b in blocks]
        self.w1 = torch.stack([b.mlp.c_fc.weight for b in blocks]).contiguous()
        self.w2 = torch.stack([b.mlp.c_proj.weight for b in blocks]).contiguous()
        self.g = torch.stack([f[0] for f in self.folds]).contiguous()
        self.c = torch.stack([f[1] for f in self.folds]).contiguous()
        self.d = torch.stack([f[2] for f in self.folds]).contiguous()
        self.b2 = torch.stack([b.mlp.c_proj.bias for b in blocks]).contiguous()
        self.eps = self.folds[0][3]
        self.layers, self.E, self.F = self.w1.shape
        self.blocks = blocks


def persistent_mlps(mlps, h, m, cnt, block_n1=32, block_n2=8, block_k=128, num_warps=4,
                    programs=None, phases=None):
    """Every MLP of `mlps` on h [1, E] in place (m [1, F]: the hidden), as one persistent kernel of
    `programs` programs (default: one per SM). phases=1: one launch per phase instead (no barrier
    runs: what Triton's CPU interpreter can do)."""
    P = programs or fused.sm_count(h.device)
    n = 2 * mlps.layers
    for lo in range(0, n, phases or n):
        hi = min(lo + (phases or n), n)
        _mlp_chain_kernel[(P,)](h, m, mlps.w1, mlps.g, mlps.c, mlps.d, mlps.w2, mlps.b2, cnt,
                                mlps.E, mlps.F, mlps.eps, lo, hi, BLOCK_N1=block_n1,
                                BLOCK_N2=block_n2, BLOCK_K=block_k, num_warps=num_warps)
    return h


def gemv_mlps(mlps, h, m, scratch, pdl=False):
    """The same chain with the library's kernels: two `fused.gemv` a layer, as `fused_forward`
    runs them."""
    for b, fold in zip(mlps.blocks, mlps.folds):
        fused.gemv(h, b.mlp.c_fc.weight, b.mlp.c_fc.bias, ln=fold, gelu=True, out=m,
                   scratch=scratch, pdl=pdl)
        fused.gemv(m, b.mlp.c_proj.weight, b.mlp.c_proj.bias, residual=h, out=h,
                   scratch=scratch, pdl=pdl)
    return h


def main(out):
    import pandas as pd
    from step_ab import bench_graph  # tools/, shared by the probes

    import fastgen_lib as fg

    configs = {"n32_n8_k128_w4": {}, "n16_n8_k128_w4": dict(block_n1=16),
               "n32_n8_k256_w8": dict(block_k=256, num_warps=8),
               "n32_n16_k128_w4": dict(block_n2=16)}
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = fg.load_model("124m", device="cuda", dtype=dtype)
        mlps = MLPs(model)
        E, F = mlps.E, mlps.F
        h0 = torch.randn(1, E, device="cuda").to(dtype)
        h, m = h0.clone(), torch.empty(1, F, device="cuda", dtype=dtype)
        cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
        scratch = fused.Buffers(model, 1, 116).scratch
        want = gemv_mlps(mlps, h0.clone(), m, scratch)
        for _round in range(2):  # A B A B: every chain twice, the later round kept
            got = {"gemv_pdl": (bench_graph(lambda i: (h.copy_(h0),
                                                       gemv_mlps(mlps, h, m, scratch, True)),
                                            calls=1), 0.0)}
            for name, cfg in configs.items():
                h.copy_(h0)
                persistent_mlps(mlps, h, m, cnt, **cfg)
                err = (h.float() - want.float()).abs().max().item()
                us = bench_graph(lambda i, cfg=cfg: (h.copy_(h0),
                                                     persistent_mlps(mlps, h, m, cnt, **cfg)),
                                 calls=1)
                got[name] = (us, err)
        for name, (us, err) in got.items():
            rows.append({"dtype": str(dtype).split(".")[1], "chain": name, "us_12_mlps": us,
                         "max_abs_err_vs_gemv": err})
        del model
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df.to_csv(out, index=False)
    print(df.round(4).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1])

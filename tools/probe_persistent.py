"""Issue 14, the next step after tools/probe_chain.py: the MLPs of GPT-2's 12 layers at batch 1 as
ONE persistent kernel, against the library's 24 GEMV kernels (`fused.gemv`, split K, a counter per
column tile, programmatic dependent launches) doing the same work in one CUDA graph.

A persistent kernel runs one program per SM (or `programs`). Its phases are the GEMVs, c_fc
(LayerNorm folded in, GELU) then mlp.c_proj (+ bias + residual), layer after layer; between phases
its programs meet at a grid-wide barrier (an atomic count and a spin). Two forms:

- `persistent_mlps` ("whole" in the CSV) splits nothing along K: each program takes whole column
  tiles (`block_n` columns, all of K) in turn, so no partial sums and no counters per tile.
- `splitk_mlps` splits K as `fused.gemv` does, into work items of `k_chunk` rows of one column
  tile; each item leaves its partial sum, and the phase after the barrier adds the partials as it
  reads its input (no counters, no last program).

Inputs written by other SMs in the phase before are read with `.cg` (from L2). Under Triton's CPU
interpreter, which runs one program at a time (a spin would never end), the same kernels are
launched once per phase (`phases` of one): the tests check the phases' math there, and the
barriers on a GPU.

  python tools/probe_persistent.py OUT_CSV     (GPU) us per chain of 12 MLPs (`step_ab.bench_graph`:
      one CUDA graph, L2 flushed before each replay), each config, both dtypes, beside the floor
      (the weights' bytes over the measured copy bandwidth)
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


@triton.jit
def _barrier(cnt_ptr, done):
    """Wait until `done` arrivals in all (this program's own included): every program's writes
    before this point are visible to every program after it."""
    tl.debug_barrier()
    seen = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
    while seen < done:
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")


@triton.jit
def _first_tile(w1_ptr, w2_ptr, ph, pid, E, F, L, NT1, NT2, S1: tl.constexpr, S2: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_CHUNK1: tl.constexpr,
                K_CHUNK2: tl.constexpr):
    """Program pid's first tile of W in phase `ph` of `_mlp_splitk_kernel` (work item pid: the
    first BLOCK_K rows of its chunk of K), zeros where it has none."""
    layer = ph // 2
    rows = tl.arange(0, BLOCK_K)
    if ph % 2 == 0:
        cols = (pid % NT1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = (pid // NT1) * K_CHUNK1 + rows
        ok = (ks < E)[:, None] & (cols < F)[None, :] & (pid < NT1 * S1) & (layer < L)
        w = tl.load(w1_ptr + layer * E * F + ks[:, None] * F + cols[None, :], mask=ok,
                    other=0.0)
    else:
        cols = (pid % NT2) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = (pid // NT2) * K_CHUNK2 + rows
        ok = (ks < F)[:, None] & (cols < E)[None, :] & (pid < NT2 * S2)
        w = tl.load(w2_ptr + layer * F * E + ks[:, None] * E + cols[None, :], mask=ok,
                    other=0.0)
    return w


@triton.jit
def _tile_or(w_pre, ptrs, mask, first, PREFETCH: tl.constexpr):
    """w_pre for a program's first tile of a phase (read before the barrier), else a load."""
    if PREFETCH:
        if first:
            w = w_pre
        else:
            w = tl.load(ptrs, mask=mask, other=0.0)
    else:
        w = tl.load(ptrs, mask=mask, other=0.0)
    return w


@triton.jit
def _mlp_splitk_kernel(hb_ptr, out_ptr, pa_ptr, pb_ptr, w1_ptr, g_ptr, c_ptr, d_ptr, w2_ptr,
                       b2_ptr, cnt_ptr, E, F, L, NT1, NT2, eps, PHASE_LO, PHASE_HI,
                       S1: tl.constexpr, S2: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, K_CHUNK1: tl.constexpr, K_CHUNK2: tl.constexpr,
                       BLOCK_E: tl.constexpr, PREFETCH: tl.constexpr,
                       BARRIER: tl.constexpr = True):
    # The same chain as _mlp_chain_kernel, each GEMV split along K as `fused.gemv` splits it,
    # but no counters and no last program: a GEMV leaves its partial sums (pa [S1, F] for c_fc,
    # pb [S2, E] for c_proj; S1, S2 chunks of K, NT1, NT2 column tiles) and the phase after
    # the barrier adds them as it reads its input.
    # Phase 2 l (c_fc of layer l): x = hb[l % 2] (+ b2[l-1] + the partials of pb, layer > 0),
    # written out whole to hb[(l+1) % 2] by the programs of column tile 0; phase 2 l + 1 (c_proj):
    # LayerNorm's mean and 1/std from hb[(l+1) % 2], m = gelu(fold(sum of pa)); phase 2 L:
    # out = the last x. hb [2, E]: hb[0] the input h; every buffer is read two barriers before
    # it is written again. S1 and S2 are constexpr: the partials' loads unrolled, all in flight
    # at once. PREFETCH: a program's first tile of W in a phase is read before the barrier ahead.
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    dt = w1_ptr.dtype.element_ty
    w_pre = _first_tile(w1_ptr, w2_ptr, PHASE_LO, pid, E, F, L, NT1, NT2, S1, S2, BLOCK_N,
                        BLOCK_K, K_CHUNK1, K_CHUNK2)
    for ph in range(PHASE_LO, PHASE_HI):
        layer = ph // 2
        h_cur = hb_ptr + (layer % 2) * E
        h_next = hb_ptr + ((layer + 1) % 2) * E
        if ph == 2 * L:  # the last c_proj's partials into out
            for e0 in range(pid * BLOCK_E, E, P * BLOCK_E):
                es = e0 + tl.arange(0, BLOCK_E)
                e_ok = es < E
                x = tl.load(h_cur + es, mask=e_ok, other=0.0, cache_modifier=".cg").to(
                    tl.float32) + tl.load(b2_ptr + (layer - 1) * E + es, mask=e_ok,
                                          other=0.0).to(tl.float32)
                for j in tl.static_range(S2):
                    x += tl.load(pb_ptr + j * E + es, mask=e_ok, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + es, x.to(dt), mask=e_ok)
        elif ph % 2 == 0:  # c_fc: pa[s, cols] = sum over the s-th chunk of (x * g) @ W1
            w1 = w1_ptr + layer * E * F
            nt = NT1
            for it in range(pid, nt * S1, P):
                n = it % nt
                cols = n * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = cols < F
                k_lo = (it // nt) * K_CHUNK1
                acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
                for k0 in range(k_lo, tl.minimum(k_lo + K_CHUNK1, E), BLOCK_K):
                    ks = k0 + tl.arange(0, BLOCK_K)
                    k_ok = ks < E
                    w = _tile_or(w_pre, w1 + ks[:, None] * F + cols[None, :],
                                 k_ok[:, None] & col_ok[None, :], (it == pid) & (k0 == k_lo),
                                 PREFETCH)
                    x = tl.load(h_cur + ks, mask=k_ok, other=0.0, cache_modifier=".cg")
                    if layer > 0:  # the residual, as `fused.gemv` stores it (in W's dtype)
                        xf = x.to(tl.float32) + tl.load(b2_ptr + (layer - 1) * E + ks,
                                                        mask=k_ok, other=0.0).to(tl.float32)
                        for j in tl.static_range(S2):
                            xf += tl.load(pb_ptr + j * E + ks, mask=k_ok, other=0.0,
                                          cache_modifier=".cg")
                        x = xf.to(dt)
                    if n == 0:
                        tl.store(h_next + ks, x, mask=k_ok)
                    xg = (x.to(tl.float32) * tl.load(g_ptr + layer * E + ks, mask=k_ok,
                                                     other=0.0).to(tl.float32)).to(dt)
                    acc += xg.to(tl.float32)[:, None] * w.to(tl.float32)
                tl.store(pa_ptr + (it // nt) * F + cols, tl.sum(acc, axis=0), mask=col_ok)
        else:  # c_proj: pb[s, cols] = sum over the s-th chunk of gelu(fold(sum of pa)) @ W2
            es = tl.arange(0, BLOCK_E)
            xe = tl.load(h_next + es, mask=es < E, other=0.0, cache_modifier=".cg").to(
                tl.float32)
            mean = tl.sum(xe, axis=0) / E
            rstd = 1.0 / tl.sqrt(tl.maximum(tl.sum(xe * xe, axis=0) / E - mean * mean, 0.0)
                                 + eps)
            w2 = w2_ptr + layer * F * E
            nt = NT2
            for it in range(pid, nt * S2, P):
                cols = (it % nt) * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = cols < E
                k_lo = (it // nt) * K_CHUNK2
                acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
                for k0 in range(k_lo, tl.minimum(k_lo + K_CHUNK2, F), BLOCK_K):
                    ks = k0 + tl.arange(0, BLOCK_K)
                    k_ok = ks < F
                    w = _tile_or(w_pre, w2 + ks[:, None] * E + cols[None, :],
                                 k_ok[:, None] & col_ok[None, :], (it == pid) & (k0 == k_lo),
                                 PREFETCH)
                    u = tl.zeros([BLOCK_K], dtype=tl.float32)
                    for j in tl.static_range(S1):
                        u += tl.load(pa_ptr + j * F + ks, mask=k_ok, other=0.0,
                                     cache_modifier=".cg")
                    u = rstd * (u - mean * tl.load(c_ptr + layer * F + ks, mask=k_ok,
                                                   other=0.0))
                    u += tl.load(d_ptr + layer * F + ks, mask=k_ok, other=0.0)
                    u = u * tl.sigmoid(2.0 * SQRT_2_OVER_PI * (u + 0.044715 * u * u * u))
                    acc += u.to(dt).to(tl.float32)[:, None] * w.to(tl.float32)
                tl.store(pb_ptr + (it // nt) * E + cols, tl.sum(acc, axis=0), mask=col_ok)
        if ph + 1 < PHASE_HI:
            if PREFETCH:  # W does not depend on the phase ahead: in flight while we wait
                w_pre = _first_tile(w1_ptr, w2_ptr, ph + 1, pid, E, F, L, NT1, NT2, S1, S2,
                                    BLOCK_N, BLOCK_K, K_CHUNK1, K_CHUNK2)
            if BARRIER:  # False: a timing of the phases alone (a wrong answer)
                _barrier(cnt_ptr, (ph + 1 - PHASE_LO) * P)
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


def splitk_mlps(mlps, h, hb, cnt, block_n=64, block_k=128, k_chunk1=128, k_chunk2=256,
                num_warps=4, programs=None, phases=None, cooperative=False, prefetch=True,
                barrier=True):
    """Every MLP of `mlps` on h [1, E] in place, each GEMV split along K (`k_chunk1` rows of
    c_fc's K, `k_chunk2` of c_proj's, per work item), as one persistent kernel of `programs`
    programs (default: one per SM); hb: a float32 buffer of `splitk_floats` floats. phases=1:
    one launch per phase (Triton's CPU interpreter). cooperative=True: launched so that CUDA
    refuses a grid whose programs cannot all be resident (its barriers would never open).
    prefetch: each program reads its first tile of the next phase's W before the barrier.
    barrier=False: no barriers, to time the phases alone (the answer is then wrong)."""
    P = programs or fused.sm_count(h.device)
    E, F, L = mlps.E, mlps.F, mlps.layers
    s1, s2 = triton.cdiv(E, k_chunk1), triton.cdiv(F, k_chunk2)
    pa, pb = hb[:s1 * F], hb[s1 * F:s1 * F + s2 * E]
    hbuf = hb[s1 * F + s2 * E:].view(h.dtype)[:2 * E]
    hbuf[:E].copy_(h.view(-1))
    n = 2 * L + 1
    for lo in range(0, n, phases or n):
        hi = min(lo + (phases or n), n)
        _mlp_splitk_kernel[(P,)](hbuf, h, pa, pb, mlps.w1, mlps.g, mlps.c, mlps.d, mlps.w2,
                                 mlps.b2, cnt, E, F, L, triton.cdiv(F, block_n),
                                 triton.cdiv(E, block_n), mlps.eps, lo, hi, S1=s1, S2=s2,
                                 PREFETCH=prefetch, BARRIER=barrier, BLOCK_N=block_n,
                                 BLOCK_K=block_k, K_CHUNK1=k_chunk1, K_CHUNK2=k_chunk2,
                                 BLOCK_E=triton.next_power_of_2(E), num_warps=num_warps,
                                 **({"launch_cooperative_grid": True} if cooperative else {}))
    return h


def splitk_floats(mlps, k_chunk1=128, k_chunk2=256, **_):
    """Float32s of the buffer `splitk_mlps` takes: both GEMVs' partial sums and two copies of h."""
    return (triton.cdiv(mlps.E, k_chunk1) * mlps.F + triton.cdiv(mlps.F, k_chunk2) * mlps.E
            + 2 * mlps.E)


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

    configs = {  # name: (chain, its tiles); persistent ones with one program per SM unless said
        "gemv_pdl": ("gemv", {}),
        "whole_n32_n8_k256_w8": ("whole", dict(block_k=256, num_warps=8)),
        "splitk_p2_no_prefetch": ("splitk", dict(programs_per_sm=2, prefetch=False)),
        "splitk_p2": ("splitk", dict(programs_per_sm=2)),
        "splitk_p2_no_barrier": ("splitk", dict(programs_per_sm=2, barrier=False)),
        "splitk_c256_p144": ("splitk", dict(k_chunk1=256, programs=144)),
        "splitk_c256_p144_no_barrier": ("splitk", dict(k_chunk1=256, programs=144,
                                                       barrier=False)),
        "splitk_t128_p144_w8": ("splitk", dict(block_n=128, k_chunk2=128, programs=144,
                                               num_warps=8)),
        "splitk_t128_p132_w8": ("splitk", dict(block_n=128, k_chunk2=128, num_warps=8)),
    }
    bandwidth = fg.measure.measure_bandwidth()  # bytes per second, a device-to-device copy
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = fg.load_model("124m", device="cuda", dtype=dtype)
        mlps = MLPs(model)
        E, F = mlps.E, mlps.F
        floor_us = 2 * mlps.layers * E * F * mlps.w1.element_size() / bandwidth * 1e6
        h0 = torch.randn(1, E, device="cuda").to(dtype)
        h, m = h0.clone(), torch.empty(1, F, device="cuda", dtype=dtype)
        cnt = torch.zeros(2, dtype=torch.int32, device="cuda")
        scratch = fused.Buffers(model, 1, 116).scratch
        want = gemv_mlps(mlps, h0.clone(), m, scratch)
        chains = {}
        for name, (kind, cfg) in configs.items():
            cfg = dict(cfg)
            if "programs_per_sm" in cfg:
                cfg["programs"] = cfg.pop("programs_per_sm") * fused.sm_count(h.device)
            if kind == "gemv":
                chains[name] = lambda: gemv_mlps(mlps, h, m, scratch, True)
            elif kind == "whole":
                chains[name] = lambda cfg=cfg: persistent_mlps(mlps, h, m, cnt, **cfg)
            else:
                hb = torch.zeros(splitk_floats(mlps, **cfg), device="cuda")
                h.copy_(h0)  # once launched cooperatively: CUDA refuses a grid not all resident
                try:
                    splitk_mlps(mlps, h, hb, cnt, cooperative=True, **cfg)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 (the probe reports it and goes on)
                    print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                chains[name] = lambda cfg=cfg, hb=hb: splitk_mlps(mlps, h, hb, cnt, **cfg)
        got = {}
        for _round in range(2):  # A B A B: every chain twice, the later round kept
            for name, fn in chains.items():
                h.copy_(h0)
                fn()
                err = (h.float() - want.float()).abs().max().item()
                us = bench_graph(lambda i, fn=fn: (h.copy_(h0), fn()), calls=1)
                got[name] = (us, err)
        for name, (us, err) in got.items():
            rows.append({"dtype": str(dtype).split(".")[1], "chain": name, "us_12_mlps": us,
                         "floor_us": floor_us, "max_abs_err_vs_gemv": err})
        del model
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    df.to_csv(out, index=False)
    print(f"bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(df.round(4).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1])

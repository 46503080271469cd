"""The step's Triton kernels and their wrappers: `gemv`, `attention`, `attention_proj` (both at
batch 1), `greedy_tail` (the token choice). The GEMV splits K over several programs when a matrix
has too few column tiles to fill the GPU; the last program of a column tile to finish (an atomic
counter) sums the partial sums, in a fixed order, and applies the epilogue. Every kernel takes
float32 or bfloat16 and accumulates in float32; at batch > 1, float32 dots run on the tensor cores
as three TF32 products each ("tf32x3": about IEEE float32's accuracy). On a Hopper GPU the kernels
are programmatic dependent launches (PDL): each reads before its wait (`gdc_wait`) what the kernel
ahead does not write (a GEMV its first tile of W and its epilogue's inputs)."""
import math

import torch
import triton
import triton.language as tl

from .tiles import INTERPRET, LOCKS, attention_blocks, gemv_tiles, scratch_size

SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2.0 / math.pi))  # a global a kernel reads: constexpr


@triton.jit
def _weight_tile(w_ptr, ks, cols, k_hi, col_ok, stride_wk, stride_wn):
    """W's rows ks (those below k_hi) and columns cols: [BLOCK_K, BLOCK_N]."""
    return tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                   mask=(ks < k_hi)[:, None] & col_ok[None, :], other=0.0)


@triton.jit
def _gelu_new(x):
    """GPT-2's gelu_new: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi)(x + .044715x^3)."""
    return x * tl.sigmoid(2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))


@triton.jit
def _store_qkv(out, y_ptr, k_ptr, v_ptr, rows, cols, out_ok, col, N, D,
               stride_yb, stride_cb, stride_ch, stride_cs):
    """Columns [q | k | v] of out: q into y [B, N/3], k and v into the cache [B, H, L, D] at col."""
    E = N // 3
    part_ix = cols // E                                                  # 0 q, 1 k, 2 v
    j = cols % E
    cache = rows[:, None] * stride_cb + (j // D)[None, :] * stride_ch + (j % D)[None, :]
    cache += col * stride_cs
    tl.store(y_ptr + rows[:, None] * stride_yb + j[None, :], out,
             mask=out_ok & (part_ix == 0)[None, :])
    tl.store(k_ptr + cache, out, mask=out_ok & (part_ix == 1)[None, :])
    tl.store(v_ptr + cache, out, mask=out_ok & (part_ix == 2)[None, :])


@triton.jit
def _tile_argmax(out, out_ok, rows, row_ok, cols, N, top_ptr, top_i_ptr):
    """Each row's largest value in out and its first column, into top and top_i [B, tiles]."""
    vals = tl.where(out_ok, out.to(tl.float32), float("-inf"))
    top = tl.max(vals, axis=1)                                           # [BLOCK_M]
    first = tl.min(tl.where(vals == top[:, None], cols[None, :], N), axis=1)
    tiles = tl.num_programs(0)
    tl.store(top_ptr + rows * tiles + tl.program_id(0), top, mask=row_ok)
    tl.store(top_i_ptr + rows * tiles + tl.program_id(0), first, mask=row_ok)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, g_ptr, c_ptr, r_ptr, part_ptr, lock_ptr, st_ptr,
                 k_ptr, v_ptr, col_ptr, emb_ptr, pe_ptr, tok_ptr, pos_ptr, top_ptr, top_i_ptr,
                 B, K, N, eps, D,
                 stride_xb, stride_wk, stride_wn, stride_yb, stride_rb,
                 stride_cb, stride_ch, stride_cs, stride_eb, stride_tb, stride_pb,
                 LN: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr,
                 QKV: tl.constexpr, EMBED: tl.constexpr, ARGMAX: tl.constexpr,
                 STATS_IN: tl.constexpr, STATS_OUT: tl.constexpr,
                 SPLIT: tl.constexpr, K_CHUNK: tl.constexpr, ONE_TILE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_F32: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    # x [B, K] @ W [K, N] (any strides: Conv1D's [in, out], or lm_head's [out, in] transposed).
    # Program (n, s, m): rows m*BLOCK_M.., columns n*BLOCK_N.., and the s-th K_CHUNK rows of W.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                       # [BLOCK_M]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                       # [BLOCK_N]
    row_ok = rows < B
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None] * stride_xb                           # [BLOCK_M, 1]
    if EMBED:  # x = wte[tok] + wpe[pos], the step's embedding, also written to x (the residual)
        e_rows = emb_ptr + tl.load(tok_ptr + rows * stride_tb, mask=row_ok, other=0) * stride_eb
        p_rows = pe_ptr + tl.load(pos_ptr + rows * stride_pb, mask=row_ok, other=0) * stride_eb

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)  # one row: products, summed after loop
    s1 = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)    # LayerNorm: sum of x and of x^2
    s2 = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    k_lo = pid_s * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    # the first tile of W, read while the kernel ahead may still run (with PDL)
    w_next = _weight_tile(w_ptr, k_lo + tl.arange(0, BLOCK_K), cols, k_hi, col_ok,
                          stride_wk, stride_wn)
    # and what the epilogue adds, which no kernel ahead in the step writes: read here, not
    # in a second trip to memory after the wait (results/h200/fused/early_epilogue/)
    bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if LN:
        c = tl.load(c_ptr + cols, mask=col_ok, other=0.0)
        if ONE_TILE:  # LayerNorm's weight over the chunk's one tile
            g1 = tl.load(g_ptr + k_lo + tl.arange(0, BLOCK_K),
                         mask=k_lo + tl.arange(0, BLOCK_K) < K, other=0.0).to(tl.float32)
    if QKV:
        col = tl.load(col_ptr)  # the cache column (the step before wrote it)
    if PDL:  # x depends on the kernel ahead: wait for it to finish
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()  # the kernel after may start on its weights
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)                                  # [BLOCK_K]
        k_ok = ks < K
        if BLOCK_M == 1 or ONE_TILE:  # the next tile is read while this one is summed
            w = w_next
            if not ONE_TILE:
                w_next = _weight_tile(w_ptr, ks + BLOCK_K, cols, k_hi, col_ok,
                                      stride_wk, stride_wn)
        else:  # tl.dot's loop: Triton pipelines its reads (the tile above is then unused)
            w = _weight_tile(w_ptr, ks, cols, k_hi, col_ok, stride_wk, stride_wn)
        x_ok = row_ok[:, None] & k_ok[None, :]
        if EMBED:
            x = (tl.load(e_rows[:, None] + ks[None, :], mask=x_ok, other=0.0).to(tl.float32)
                 + tl.load(p_rows[:, None] + ks[None, :], mask=x_ok, other=0.0).to(tl.float32))
            x = x.to(x_ptr.dtype.element_ty)  # rounded once, as torch adds in the model's dtype
            if pid_n == 0:
                tl.store(x_rows + ks[None, :], x, mask=x_ok)
        else:
            x = tl.load(x_rows + ks[None, :], mask=x_ok, other=0.0)
        if LN:  # x * g here; the mean and 1/std are applied once, after the sum over K
            xf = x.to(tl.float32)
            if STATS_IN == 0:  # (else the GEMV ahead summed x, as it wrote it)
                s1 += xf
                s2 += xf * xf
            if ONE_TILE:
                g = g1
            else:
                g = tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = (xf * g[None, :]).to(w_ptr.dtype.element_ty)
        if BLOCK_M == 1:  # one row: a broadcast multiply, no padded dot, no reduction yet
            xk = tl.sum(x.to(tl.float32), axis=0)                        # [BLOCK_K]
            if ONE_TILE:  # the chunk is this tile, read before the wait: summed at once
                acc = tl.sum(xk[:, None] * w.to(tl.float32), axis=0)[None, :]
            else:
                acc1 += xk[:, None] * w.to(tl.float32)
        else:
            if DOT_F32:  # the CPU interpreter's dot multiplies bfloat16's raw bits: upcast
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, w, acc, input_precision=PRECISION)           # [BLOCK_M, BLOCK_N]
    if BLOCK_M == 1 and not ONE_TILE:
        acc = tl.sum(acc1, axis=0)[None, :]  # across threads, once
    if LN and STATS_IN == 0:
        sum1 = tl.sum(s1, axis=1)                                        # [BLOCK_M]
        sum2 = tl.sum(s2, axis=1)

    out_ok = row_ok[:, None] & col_ok[None, :]
    last = True
    if SPLIT > 1:  # leave the partial sums; the tile's last program adds them all up
        part = part_ptr + rows[:, None] * N + cols[None, :]
        stat = part_ptr + SPLIT * B * N + (pid_n * SPLIT * B + rows) * 2  # [BLOCK_M]
        tl.store(part + pid_s * B * N, acc, mask=out_ok)
        if LN and STATS_IN == 0:
            tl.store(stat + pid_s * B * 2, sum1, mask=row_ok)
            tl.store(stat + pid_s * B * 2 + 1, sum2, mask=row_ok)
        tl.debug_barrier()  # every thread's store is issued before the counter moves
        lock = lock_ptr + pid_m * tl.num_programs(0) + pid_n
        last = tl.atomic_add(lock, 1, sem="acq_rel") == SPLIT - 1
    if last:
        if SPLIT > 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            sum1 = tl.zeros([BLOCK_M], dtype=tl.float32)
            sum2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # fixed order, whoever came last; unrolled
                acc += tl.load(part + s * B * N, mask=out_ok, other=0.0,
                               cache_modifier=".cg")  # (from L2: written by other SMs)
                if LN and STATS_IN == 0:
                    sum1 += tl.load(stat + s * B * 2, mask=row_ok, other=0.0,
                                    cache_modifier=".cg")
                    sum2 += tl.load(stat + s * B * 2 + 1, mask=row_ok, other=0.0,
                                    cache_modifier=".cg")
            tl.atomic_xchg(lock, 0)  # ready for the next kernel
        if LN:  # LN(x) @ W + b = r (x*g @ W - mu c) + d; c = g @ W, d = beta @ W + b
            if STATS_IN > 0:  # x's sums from the GEMV ahead: a pair per its column tile
                sum1 = tl.zeros([BLOCK_M], dtype=tl.float32)
                sum2 = tl.zeros([BLOCK_M], dtype=tl.float32)
                for t in tl.static_range(STATS_IN):
                    sum1 += tl.load(st_ptr + (t * B + rows) * 2, mask=row_ok, other=0.0)
                    sum2 += tl.load(st_ptr + (t * B + rows) * 2 + 1, mask=row_ok, other=0.0)
            mean = sum1 / K
            rstd = 1.0 / tl.sqrt(tl.maximum(sum2 / K - mean * mean, 0.0) + eps)
            acc = rstd[:, None] * (acc - mean[:, None] * c[None, :])
        acc += bias[None, :]
        if GELU:
            acc = _gelu_new(acc)
        if RESIDUAL:  # (may be y itself: each element is read, then written, by this program only)
            r = tl.load(r_ptr + rows[:, None] * stride_rb + cols[None, :], mask=out_ok, other=0.0)
            acc += r.to(tl.float32)
        out = acc.to(y_ptr.dtype.element_ty)
        if STATS_OUT:  # the next LayerNorm's sums of y as stored, over this tile's columns
            yf = tl.where(out_ok, out.to(tl.float32), 0.0)
            tl.store(st_ptr + (pid_n * B + rows) * 2, tl.sum(yf, axis=1), mask=row_ok)
            tl.store(st_ptr + (pid_n * B + rows) * 2 + 1, tl.sum(yf * yf, axis=1), mask=row_ok)
        if QKV:  # q into y, k and v into the cache at `col`
            _store_qkv(out, y_ptr, k_ptr, v_ptr, rows, cols, out_ok, col, N, D,
                       stride_yb, stride_cb, stride_ch, stride_cs)
        else:
            tl.store(y_ptr + rows[:, None] * stride_yb + cols[None, :], out, mask=out_ok)
        if ARGMAX:
            _tile_argmax(out, out_ok, rows, row_ok, cols, N, top_ptr, top_i_ptr)


def gemv(x, weight, bias, *, ln=None, gelu=False, residual=None, qkv=None, embed=None,
         argmax=None, stats_out=None, ln_stats=None, out=None, scratch=None,
         block_n=None, block_k=None, programs_per_sm=None, split=None, num_warps=4, pdl=False):
    """x [B, K] @ weight [K, N] + bias [N] -> [B, N] (in x's dtype, or into `out`), then GELU (tanh)
    with gelu=True, or + residual [B, N] (which may be `out` itself).
    ln=(g, c, d, eps): x is LayerNorm'd first (weight g [K]), folded in: c = g @ weight and
    d = beta @ weight + bias, float32 [N], from `fold_layernorm` (bias is then unused).
    qkv=(keys, values, col): the columns are [q | k | v]; q to the result [B, N/3], k and v into
    the cache [B, H, L, D] at column `col` (a 0-d tensor).
    embed=(wte, wpe, tok, pos): x is wte[tok] + wpe[pos] (tok, pos [B, 1]), also written into x.
    argmax=(top, top_i) float32 and int32 [B, tiles] (`gemv_tiles`): each row's largest value per
    column tile and its first column. stats_out: float32 [tiles, B, 2], each row's sum and sum
    of squares of the result over each column tile: for the next GEMV's LayerNorm, given as its
    ln_stats (with ln): x's sums are then not taken in its loop.
    scratch=(partials, locks): float32 [>= scratch_size] and int32 zeros [LOCKS], buffers for
    the split, made per call when None. pdl=True: launched as a programmatic dependent launch
    (`supports_pdl`): the kernel reads its first weight tile, the bias, c, g and the cache
    column while the kernel ahead of it in the stream finishes (so that kernel must not write
    them; x, the residual and ln_stats are read after it). block_n, block_k,
    programs_per_sm, split: the tiles (`gemv_tiles`), num_warps: per program."""
    B, K = x.shape
    K2, N = weight.shape
    assert K == K2 and bias.shape == (N,), (x.shape, weight.shape, bias.shape)
    assert x.stride(-1) == 1 and bias.is_contiguous()
    tiles = dict(block_n=block_n, block_k=block_k, programs_per_sm=programs_per_sm,
                 dtype=weight.dtype, split=split)
    bm, bn, bk, split, k_chunk = gemv_tiles(B, K, N, x.device, **tiles)
    n_out = N // 3 if qkv is not None else N
    y = out if out is not None else torch.empty(B, n_out, dtype=x.dtype, device=x.device)
    assert y.shape == (B, n_out) and y.stride(-1) == 1
    need = scratch_size(B, K, N, x.device, **tiles)
    if scratch is None:
        scratch = (torch.empty(need, dtype=torch.float32, device=x.device),
                   torch.zeros(LOCKS, dtype=torch.int32, device=x.device))
    part, locks = scratch
    assert part.numel() >= need, "scratch partials too small"
    assert triton.cdiv(N, bn) * triton.cdiv(B, bm) <= locks.numel()
    g, c, d, eps = ln if ln is not None else (bias, bias, bias, 0.0)
    r = residual if residual is not None else y
    assert residual is None or (residual.shape == (B, N) and residual.stride(-1) == 1)
    keys, values, col = qkv if qkv is not None else (y, y, locks)
    D = keys.shape[-1] if qkv is not None else 1
    assert qkv is None or (keys.stride() == values.stride() and keys.shape[1] * D == N // 3)
    wte, wpe, tok, pos = embed if embed is not None else (y, y, locks, locks)
    assert embed is None or wte.stride() == wpe.stride()
    top, top_i = argmax if argmax is not None else (y, locks)
    assert stats_out is None or (stats_out.shape == (triton.cdiv(N, bn), B, 2)
                                 and stats_out.is_contiguous() and qkv is None and ln_stats is None)
    assert ln_stats is None or (ln is not None and ln_stats.shape[1:] == (B, 2)
                                and ln_stats.is_contiguous())
    stats = stats_out if stats_out is not None else ln_stats
    assert argmax is None or top.shape == top_i.shape == (B, triton.cdiv(N, bn))
    grid = (triton.cdiv(N, bn), split, triton.cdiv(B, bm))
    _gemv_kernel[grid](
        x, weight, d if ln is not None else bias, y, g, c, r, part, locks,
        stats if stats is not None else part, keys, values, col, wte, wpe, tok, pos, top, top_i,
        B, K, N, eps, D,
        x.stride(0), weight.stride(0), weight.stride(1), y.stride(0), r.stride(0),
        keys.stride(0), keys.stride(1) if qkv is not None else 0,
        keys.stride(2) if qkv is not None else 0, wte.stride(0), tok.stride(0), pos.stride(0),
        LN=ln is not None, GELU=gelu, RESIDUAL=residual is not None, QKV=qkv is not None,
        EMBED=embed is not None, ARGMAX=argmax is not None, STATS_OUT=stats_out is not None,
        STATS_IN=ln_stats.shape[0] if ln_stats is not None else 0,
        SPLIT=split, K_CHUNK=k_chunk, ONE_TILE=k_chunk == bk, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        DOT_F32=INTERPRET and weight.dtype != torch.float32,
        PRECISION="tf32x3" if weight.dtype == torch.float32 and not INTERPRET else "ieee",
        PDL=pdl, num_warps=num_warps, **({"launch_pdl": True} if pdl else {}))
    return y


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, col_ptr, part_ptr, lock_ptr,
                      H, S, D, scale,
                      stride_qb, stride_kb, stride_kh, stride_ks, stride_mb, stride_ob,
                      HAS_COL: tl.constexpr, SPLITS: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
                      EARLY_KV: tl.constexpr):
    # q [B, H*D], K/V [B, H, S, D] (the cache), mask [B, S] (nonzero = attend) -> o [B, H*D].
    # Program (b*H + h, s) takes keys s*BLOCK_S.. up to column `col` (the later slots are unused):
    # a softmax over its block (float32), left as (max, sum, weighted values); the last program
    # of (b, h) to finish combines the blocks, as flash-decoding does.
    # EARLY_KV: the keys and values of the slots before `col` are read before the wait (earlier
    # steps wrote them; the kernel ahead writes only column `col`), the rest after it.
    if PDL and not EARLY_KV:  # all here depends on the kernel ahead: wait, let the next start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    b = pid // H
    h = pid % H
    n_keys = tl.load(col_ptr) + 1 if HAS_COL else S
    n_blocks = tl.cdiv(n_keys, BLOCK_S)
    if sid < n_blocks:
        ds = tl.arange(0, BLOCK_D)
        d_ok = ds < D
        if EARLY_KV:
            ss = sid * BLOCK_S + tl.arange(0, BLOCK_S)
            kv = b * stride_kb + h * stride_kh + ss[:, None] * stride_ks + ds[None, :]
            old = ((ss < n_keys - 1)[:, None]) & d_ok[None, :]
            k_early = tl.load(k_ptr + kv, mask=old, other=0.0)
            v_early = tl.load(v_ptr + kv, mask=old, other=0.0)
            if PDL:
                tl.extra.cuda.gdc_wait()
                tl.extra.cuda.gdc_launch_dependents()
            new = ((ss == n_keys - 1)[:, None]) & d_ok[None, :]          # column `col`
            k_early = tl.where(new, tl.load(k_ptr + kv, mask=new, other=0.0), k_early)
            v_early = tl.where(new, tl.load(v_ptr + kv, mask=new, other=0.0), v_early)
        q = tl.load(q_ptr + b * stride_qb + h * D + ds, mask=d_ok, other=0.0).to(tl.float32)
        ss = sid * BLOCK_S + tl.arange(0, BLOCK_S)                         # [BLOCK_S]
        s_ok = ss < n_keys
        keep = (tl.load(m_ptr + b * stride_mb + ss, mask=s_ok, other=0) != 0) & s_ok
        kv = b * stride_kb + h * stride_kh + ss[:, None] * stride_ks + ds[None, :]
        kv_ok = s_ok[:, None] & d_ok[None, :]
        if EARLY_KV:
            k = k_early.to(tl.float32)
        else:
            k = tl.load(k_ptr + kv, mask=kv_ok, other=0.0).to(tl.float32)
        scores = tl.where(keep, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        m = tl.maximum(tl.max(scores, axis=0), -1.0e30)  # finite: a masked block weighs 0, no NaN
        p = tl.where(keep, tl.exp(scores - m), 0.0)                         # [BLOCK_S]
        if EARLY_KV:
            v = v_early.to(tl.float32)
        else:
            v = tl.load(v_ptr + kv, mask=kv_ok, other=0.0).to(tl.float32)
        acc = tl.sum(p[:, None] * v, axis=0)                                # [BLOCK_D]
        l = tl.sum(p, axis=0)
        if SPLITS > 1:
            part = part_ptr + pid * SPLITS * (BLOCK_D + 2)                  # this (b, h)'s blocks
            tl.store(part + sid * (BLOCK_D + 2) + ds, acc)
            tl.store(part + sid * (BLOCK_D + 2) + BLOCK_D, m)
            tl.store(part + sid * (BLOCK_D + 2) + BLOCK_D + 1, l)
            tl.debug_barrier()
            if tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel") == n_blocks - 1:
                bs = tl.arange(0, SPLITS)
                b_ok = bs < n_blocks
                ms = tl.load(part + bs * (BLOCK_D + 2) + BLOCK_D, mask=b_ok, other=-1.0e30,
                             cache_modifier=".cg")
                ls = tl.load(part + bs * (BLOCK_D + 2) + BLOCK_D + 1, mask=b_ok, other=0.0,
                             cache_modifier=".cg")
                accs = tl.load(part + bs[:, None] * (BLOCK_D + 2) + ds[None, :],
                               mask=b_ok[:, None], other=0.0, cache_modifier=".cg")
                wts = tl.exp(ms - tl.max(ms, axis=0))                        # [SPLITS]
                acc = tl.sum(wts[:, None] * accs, axis=0)
                l = tl.sum(wts * ls, axis=0)
                tl.store(o_ptr + b * stride_ob + h * D + ds, (acc / l).to(o_ptr.dtype.element_ty),
                         mask=d_ok)
                tl.atomic_xchg(lock_ptr + pid, 0)
        else:  # one block: no key to attend gives NaN, as softmax over all -inf does
            tl.store(o_ptr + b * stride_ob + h * D + ds, (acc / l).to(o_ptr.dtype.element_ty),
                     mask=d_ok)


def attention(q, keys, values, mask, col=None, scale=None, out=None, scratch=None, block_s=32,
              num_warps=2, pdl=False, early_kv=False):
    """softmax(q . K^T * scale, masked) @ V for one query token per row and head: q [B, H*D],
    keys/values [B, H, S, D], mask [B, S] (bool or int, nonzero = attend) -> [B, H*D] in values'
    dtype (or into `out`). With `col` (0-d tensor), only slots 0..col are read: the later ones are
    unused. scale defaults to D ** -0.5. scratch=(partials, locks), as `gemv`'s: float32
    [>= B*H*splits*(D+2)] and int32 zeros [>= B*H]. pdl: as `gemv`'s. early_kv=True (with `col`):
    the slots before `col` are read before the wait for the kernel ahead, which may write only
    column `col` (as the step's QKV GEMV does: `fused_forward`)."""
    B, H, S, D = keys.shape
    assert col is not None or not early_kv, "early_kv reads the slots before `col`"
    assert q.shape == (B, H * D) and values.shape == keys.shape and mask.shape == (B, S), \
        (q.shape, keys.shape, values.shape, mask.shape)
    assert q.stride(-1) == 1 and keys.stride() == values.stride() and keys.stride(-1) == 1
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes, no copy
    assert mask.stride(-1) == 1
    block_s, splits = attention_blocks(S, block_s)
    block_d = triton.next_power_of_2(D)
    if scratch is None:
        scratch = (torch.empty(B * H * splits * (block_d + 2), device=q.device),
                   torch.zeros(B * H, dtype=torch.int32, device=q.device))
    assert scratch[0].numel() >= B * H * splits * (block_d + 2) and scratch[1].numel() >= B * H
    o = out if out is not None else torch.empty(B, H * D, dtype=values.dtype, device=values.device)
    _attention_kernel[(B * H, splits)](
        q, keys, values, mask, o, col if col is not None else mask, *scratch, H, S, D,
        D ** -0.5 if scale is None else scale,
        q.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), mask.stride(0), o.stride(0),
        HAS_COL=col is not None, SPLITS=splits, BLOCK_S=block_s, BLOCK_D=block_d, PDL=pdl,
        EARLY_KV=early_kv, num_warps=num_warps, **({"launch_pdl": True} if pdl else {}))
    return o


@triton.jit
def _softmax_block(q, k, v, keep, scale, m_i, l_i, acc):
    """One block of keys of an online softmax: (max, sum, weighted values) updated."""
    scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
    scores = tl.where(keep, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=0))  # finite: a masked block weighs 0
    alpha = tl.exp(m_i - m_new)
    p = tl.where(keep, tl.exp(scores - m_new), 0.0)                        # [BLOCK_S]
    return (m_new, l_i * alpha + tl.sum(p, axis=0),
            acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0))


@triton.jit
def _attention_proj_kernel(q_ptr, k_ptr, v_ptr, m_ptr, w_ptr, b_ptr, r_ptr, y_ptr, col_ptr,
                           part_ptr, lock_ptr, B, H: tl.constexpr, D, N, scale,
                           stride_qb, stride_kb, stride_kh, stride_ks, stride_mb,
                           stride_wk, stride_wn, stride_rb, stride_yb,
                           BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    # y [B, N] = attention(q, K, V) [B, H*D] @ W [H*D, N] + bias + r. Head h's output
    # meets only rows h*D.. of W: program (n, h, b) attends with head h of row b over
    # slots 0..col, then multiplies by its D rows of W, columns n*BLOCK_N..: one of H
    # partial sums, which the last program of (b, n) adds up in order (as `gemv` does).
    pid_n = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ds = tl.arange(0, BLOCK_D)
    d_ok = ds < D
    # before the wait: the weights, and the keys and values earlier steps wrote (< col)
    w = _weight_tile(w_ptr, h * D + ds, cols, h * D + D, col_ok, stride_wk, stride_wn)
    n_keys = tl.load(col_ptr) + 1
    ss = tl.arange(0, BLOCK_S)
    kv = b * stride_kb + h * stride_kh + ss[:, None] * stride_ks + ds[None, :]
    old = (ss < n_keys - 1)[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + kv, mask=old, other=0.0)
    v = tl.load(v_ptr + kv, mask=old, other=0.0)
    bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if PDL:  # q and column `col` of the cache come from the QKV GEMV ahead
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    new = (ss == n_keys - 1)[:, None] & d_ok[None, :]
    k = tl.where(new, tl.load(k_ptr + kv, mask=new, other=0.0), k)
    v = tl.where(new, tl.load(v_ptr + kv, mask=new, other=0.0), v)
    q = tl.load(q_ptr + b * stride_qb + h * D + ds, mask=d_ok, other=0.0).to(tl.float32)
    s_ok = ss < n_keys
    keep = (tl.load(m_ptr + b * stride_mb + ss, mask=s_ok, other=0) != 0) & s_ok
    m_i, l_i, acc = _softmax_block(q, k, v, keep, scale, -1.0e30, 0.0,
                                   tl.zeros([BLOCK_D], dtype=tl.float32))
    for s0 in range(BLOCK_S, n_keys, BLOCK_S):  # caches longer than one block
        sj = s0 + tl.arange(0, BLOCK_S)
        s_ok = sj < n_keys
        kv_j = b * stride_kb + h * stride_kh + sj[:, None] * stride_ks + ds[None, :]
        m_i, l_i, acc = _softmax_block(
            q, tl.load(k_ptr + kv_j, mask=s_ok[:, None] & d_ok[None, :], other=0.0),
            tl.load(v_ptr + kv_j, mask=s_ok[:, None] & d_ok[None, :], other=0.0),
            (tl.load(m_ptr + b * stride_mb + sj, mask=s_ok, other=0) != 0) & s_ok,
            scale, m_i, l_i, acc)
    o = (acc / l_i).to(w_ptr.dtype.element_ty).to(tl.float32)  # as `attention` stores
    part = part_ptr + b * N + cols                         # this (b, n)'s partial sums
    tl.store(part + h * B * N, tl.sum(o[:, None] * w.to(tl.float32), 0), mask=col_ok)
    tl.debug_barrier()  # every thread's store is issued before the counter moves
    lock = lock_ptr + b * tl.num_programs(0) + pid_n
    if tl.atomic_add(lock, 1, sem="acq_rel") == H - 1:
        y = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i in tl.static_range(H):  # fixed order, whoever came last; unrolled: the H
            y += tl.load(part + i * B * N, mask=col_ok, other=0.0,  # reads at once
                         cache_modifier=".cg")
        tl.atomic_xchg(lock, 0)  # ready for the next kernel
        y += bias
        r = tl.load(r_ptr + b * stride_rb + cols, mask=col_ok, other=0.0)
        y = (y + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + b * stride_yb + cols, y, mask=col_ok)


def attention_proj(q, keys, values, mask, col, weight, bias, residual, out=None,
                   scratch=None, block_n=64, block_s=128, num_warps=4, pdl=False):
    """attention(q, keys, values, mask, col) @ weight [H*D, N] + bias [N] + residual [B, N]
    in one kernel (into `out`, which may be `residual` itself): the step's attention and
    out-projection at batch 1. Each of the N/block_n column tiles attends again (H
    programs each): more reads of the cache, one kernel and one round trip through memory
    fewer. The slots before `col` are read before the PDL wait, as with
    `attention(early_kv=True)`. scratch: as `gemv`'s, float32 [>= H*B*N] and int32 zeros
    [>= B*N/block_n]."""
    B, H, S, D = keys.shape
    K, N = weight.shape
    assert q.shape == (B, H * D) == (B, K) and values.shape == keys.shape, (q.shape, K)
    assert mask.shape == (B, S) and bias.shape == (N,) and residual.shape == (B, N)
    assert q.stride(-1) == 1 and keys.stride() == values.stride() and keys.stride(-1) == 1
    assert bias.is_contiguous() and residual.stride(-1) == 1
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    y = out if out is not None else torch.empty_like(residual)
    assert y.shape == (B, N) and y.stride(-1) == 1 and mask.stride(-1) == 1
    tiles = triton.cdiv(N, block_n)
    if scratch is None:
        scratch = (torch.empty(H * B * N, dtype=torch.float32, device=q.device),
                   torch.zeros(B * tiles, dtype=torch.int32, device=q.device))
    assert scratch[0].numel() >= H * B * N and scratch[1].numel() >= B * tiles
    _attention_proj_kernel[(tiles, H, B)](
        q, keys, values, mask, weight, bias, residual, y, col, *scratch, B, H, D, N,
        D ** -0.5, q.stride(0), keys.stride(0), keys.stride(1), keys.stride(2),
        mask.stride(0), weight.stride(0), weight.stride(1), residual.stride(0), y.stride(0),
        BLOCK_S=min(block_s, triton.next_power_of_2(S)), BLOCK_D=triton.next_power_of_2(D),
        BLOCK_N=block_n, PDL=pdl, num_warps=num_warps, **({"launch_pdl": True} if pdl else {}))
    return y


@triton.jit
def _greedy_tail_kernel(val_ptr, idx_ptr, fin_ptr, pad_ptr, eos_ptr, out_ptr, tok_ptr, pos_ptr,
                        col_ptr, done_ptr, lock_ptr, B, V, N_EOS, stride_vb, stride_ob,
                        HAS_IDX: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
                        PDL: tl.constexpr):
    # One program per row: the first index of the row's largest value (torch.argmax's choice), then
    # `choose` and `decode_step`'s writes. The last row to finish sets done and col += 1.
    # HAS_IDX: the values are per-tile maxima, with their indices in idx_ptr (gemv's argmax).
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK_V], dtype=tl.int32)
    for v0 in range(0, V, BLOCK_V):
        vs = v0 + tl.arange(0, BLOCK_V)
        x = tl.load(val_ptr + b * stride_vb + vs, mask=vs < V, other=float("-inf"))
        if HAS_IDX:
            i = tl.load(idx_ptr + b * stride_vb + vs, mask=vs < V, other=0)
        else:
            i = vs
        better = x > best  # strictly: an earlier index keeps a tie
        best = tl.where(better, x, best)
        best_i = tl.where(better, i, best_i)
    top = tl.max(best, axis=0)
    nxt = tl.min(tl.where(best == top, best_i, 2147483647), axis=0).to(tl.int64)
    fin = tl.load(fin_ptr + b) != 0
    nxt = tl.where(fin, tl.load(pad_ptr), nxt)
    for e in range(N_EOS):
        fin = fin | (nxt == tl.load(eos_ptr + e))
    col = tl.load(col_ptr)                    # the column of the token this step read
    tl.store(fin_ptr + b, fin.to(tl.uint8))
    tl.store(out_ptr + b * stride_ob + col + 1, nxt)
    tl.store(tok_ptr + b, nxt)
    tl.store(pos_ptr + b, tl.load(pos_ptr + b) + 1)
    tl.debug_barrier()
    if tl.atomic_add(lock_ptr, 1, sem="acq_rel") == B - 1:  # the last row: every row is written
        rs = tl.arange(0, BLOCK_B)
        f = tl.load(fin_ptr + rs, mask=rs < B, other=1, cache_modifier=".cg")
        tl.store(done_ptr, tl.min(f, axis=0))
        tl.store(col_ptr, col + 1)
        tl.atomic_xchg(lock_ptr, 0)


def greedy_tail(logits, finished, chooser, out, tok, step_pos, col, done, locks, tiles=None,
                block_v=1024, pdl=False):
    """`choose` under greedy decoding plus the rest of `decode_step`, in one kernel: the next token
    (argmax of logits [B, V] float32; pad for finished rows; EOS finishes a row) into out at column
    col + 1 and into `tok` [B, 1]; step_pos += 1; done = all(finished); col += 1.
    tiles=(top, top_i) from `gemv(..., argmax=...)`: the argmax is taken over those per-tile maxima
    instead of the whole row (a few hundred values, not V). pdl: as `gemv`'s."""
    B = logits.shape[0]
    assert not chooser.do_sample and logits.stride(-1) == 1 and out.stride(-1) == 1
    vals, idx = tiles if tiles is not None else (logits, logits)
    assert vals.stride(-1) == 1 and (tiles is None or idx.stride() == vals.stride())
    n_eos = len(chooser.eos) if chooser.use_eos else 0
    _greedy_tail_kernel[(B,)](
        vals, idx, finished.view(torch.uint8), chooser.pad, chooser.eos, out, tok, step_pos, col,
        done.view(torch.uint8), locks, B, vals.shape[1], n_eos, vals.stride(0), out.stride(0),
        HAS_IDX=tiles is not None, BLOCK_V=min(block_v, triton.next_power_of_2(vals.shape[1])),
        BLOCK_B=triton.next_power_of_2(B), PDL=pdl, **({"launch_pdl": True} if pdl else {}))


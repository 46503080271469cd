"""Issue 14, batch 32 in float32 (target 0.6 ms a step; 0.82 measured): the layer GEMVs with
the operands swapped. `fused.gemv` at batch 32 multiplies x [32, K] by a tile of W with tl.dot,
whose M (rows of the product) is the batch: 32, below the 64 rows of Hopper's warpgroup MMA
(wgmma), so Triton runs Ampere's mma.sync, three TF32 products a dot. Here each program
computes y^T = W^T x^T for BLOCK_N columns: M is BLOCK_N (64 or 128), N the batch (32), the
weight read from a copy with K contiguous (A operand, K-major) and x as it is (B operand,
K-major too, as TF32 wgmma wants both). K split into SPLIT chunks, the last program of a column
tile adding the partial sums in order, as `fused.gemv` does.
Each GEMV alone (`step_ab.bench_graph`: 20 calls on 20 copies of the weight in one CUDA graph,
L2 flushed), over BLOCK_N, BLOCK_K, SPLIT, warps, stages, in tf32x3 and in one TF32 product
(`tf32`, not float32's accuracy: how much of the time is the tensor cores'), beside
`fused.gemv` with the library's tiles; the largest error against float64 for each.
Usage: python tools/probe_b32_swap.py OUT_DIR"""
import itertools
import pathlib
import sys

import pandas as pd
import torch
import triton
import triton.language as tl

from fastgen_lib import fused

SHAPES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072),
          "mlp.c_proj": (3072, 768)}
B = 32
CALLS = 20


@triton.jit
def _swap_kernel(x_ptr, wt_ptr, b_ptr, y_ptr, part_ptr, lock_ptr, B, K, N,
                 stride_xb, stride_wn, stride_yb,
                 SPLIT: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    # y [B, N] = x [B, K] @ W [K, N] + b, W read as wt [N, K] (K contiguous). Program (n, s):
    # columns n*BLOCK_N.., the s-th K_CHUNK rows of K, all B rows: acc [BLOCK_N, BLOCK_B] = y^T.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)                          # [BLOCK_N]
    bs = tl.arange(0, BLOCK_B)                                            # [BLOCK_B]
    n_ok = ns < N
    b_ok = bs < B
    k_lo = pid_s * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):  # pipelined over `stages` (the launch's num_stages)
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        w = tl.load(wt_ptr + ns[:, None] * stride_wn + ks[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)       # [BLOCK_N, BLOCK_K]
        xt = tl.load(x_ptr + bs[None, :] * stride_xb + ks[:, None],
                     mask=k_ok[:, None] & b_ok[None, :], other=0.0)      # [BLOCK_K, BLOCK_B]
        acc = tl.dot(w, xt, acc, input_precision=PRECISION)
    out_ok = n_ok[:, None] & b_ok[None, :]
    at = ns[:, None] + bs[None, :] * N                                    # y's [b, n] offsets
    last = True
    if SPLIT > 1:
        tl.store(part_ptr + pid_s * B * N + at, acc, mask=out_ok)
        tl.debug_barrier()
        last = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1
    if last:
        if SPLIT > 1:
            acc = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # fixed order, whoever came last
                acc += tl.load(part_ptr + s * B * N + at, mask=out_ok, other=0.0,
                               cache_modifier=".cg")
            tl.atomic_xchg(lock_ptr + pid_n, 0)
        acc += tl.load(b_ptr + ns, mask=n_ok, other=0.0)[:, None]
        tl.store(y_ptr + bs[None, :] * stride_yb + ns[:, None], acc, mask=out_ok)


def swap_gemv(x, wt, bias, out, part, locks, block_n=64, block_k=32, split=4, num_warps=4,
              stages=3, precision="tf32x3"):
    """x [B, K] @ wt.T + bias into out [B, N]; wt [N, K] contiguous (W with K contiguous);
    part: float32 [>= split * B * N], locks: int32 zeros [>= N / block_n]. Returns the
    launched kernel (its PTX: whether Triton chose wgmma)."""
    Bx, K = x.shape
    N = wt.shape[0]
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    split = triton.cdiv(K, k_chunk)
    assert wt.is_contiguous() and x.stride(-1) == 1 and part.numel() >= split * Bx * N
    return _swap_kernel[(triton.cdiv(N, block_n), split)](
        x, wt, bias, out, part, locks, Bx, K, N, x.stride(0), wt.stride(0), out.stride(0),
        SPLIT=split, K_CHUNK=k_chunk, BLOCK_N=block_n, BLOCK_B=triton.next_power_of_2(Bx),
        BLOCK_K=block_k, PRECISION=precision, num_warps=num_warps, num_stages=stages)


GRID = [dict(block_n=n, block_k=k, split=sp, num_warps=n // 16, stages=3)
        for n, k, sp in itertools.product((64, 128), (32, 64), (1, 2, 4, 8))]


def operands(name, device, calls=CALLS):
    K, N = SHAPES[name]
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(B, K, generator=g).to(device)
    ws = [(torch.randn(K, N, generator=g) * K ** -0.5).to(device) for _ in range(calls)]
    b = (torch.randn(N, generator=g) * 0.1).to(device)
    return x, ws, b


def swap_call(name, tiles, precision, device="cuda", calls=CALLS):
    """(fn, out, err, wgmma): fn(i) runs swap_gemv on copy i of the weight into out; err is
    call 0's largest error against float64; wgmma whether Triton chose Hopper's MMA."""
    x, ws, b = operands(name, device, calls)
    K, N = SHAPES[name]
    wts = [w.t().contiguous() for w in ws]
    out = torch.empty(B, N, device=device)
    part = torch.empty(8 * B * N, device=device)
    locks = torch.zeros(N, dtype=torch.int32, device=device)

    def fn(i):
        return swap_gemv(x, wts[i], b, out, part, locks, precision=precision, **tiles)
    want = x.double() @ ws[0].double() + b.double()
    kernel = fn(0)
    err = (out.double() - want).abs().max().item()
    return fn, out, err, kernel is not None and "wgmma" in kernel.asm.get("ptx", "")


def library_call(name, device="cuda", calls=CALLS):
    """(fn, err) for `fused.gemv` with its own tiles, its scratch made once (not per call,
    which would add a memset to every call in the graph)."""
    x, ws, b = operands(name, device, calls)
    K, N = SHAPES[name]
    out = torch.empty(B, N, device=device)
    scratch = (torch.empty(fused.scratch_size(B, K, N, x.device), device=device),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device=device))
    fn = lambda i: fused.gemv(x, ws[i], b, out=out, scratch=scratch)  # noqa: E731
    want = x.double() @ ws[0].double() + b.double()
    return fn, (fn(0).double() - want).abs().max().item()


def swap_row(name, tiles, precision):
    """One timed configuration as a dict (None: it did not compile or launch)."""
    from step_ab import bench_graph
    try:
        fn, _, err, wgmma = swap_call(name, tiles, precision)
        us = bench_graph(fn, CALLS)
    except Exception as e:  # out of resources
        print(name, tiles, precision, type(e).__name__, flush=True)
        return None
    return {"name": name, "form": "swap", "precision": precision, **tiles, "us": us,
            "max_err": err, "wgmma": wgmma}


def main(out):
    from step_ab import bench_graph
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in SHAPES:
        fn, err = library_call(name)
        rows.append({"name": name, "form": "library", "precision": "tf32x3",
                     "us": bench_graph(fn, CALLS), "max_err": err})
        print(rows[-1], flush=True)
        found = [r for r in (swap_row(name, t, "tf32x3") for t in GRID) if r]
        rows += found
        best = min(found, key=lambda r: r["us"])  # its tiles in one TF32 product
        tiles = {k: best[k] for k in GRID[0]}
        one_tf32 = [r for r in [swap_row(name, tiles, "tf32")] if r]
        rows += one_tf32
        for r in sorted(found, key=lambda r: r["us"])[:3] + one_tf32:
            print(r, flush=True)
        pd.DataFrame(rows).to_csv(out / "gemv_b32_swap.csv", index=False)
    df = pd.DataFrame(rows)
    df["gb_s"] = [SHAPES[n][0] * SHAPES[n][1] * 4 / 1e3 / us for n, us in zip(df.name, df.us)]
    df.to_csv(out / "gemv_b32_swap.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

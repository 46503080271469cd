"""Issue 14: at batch 32 in float32, a GEMV that reads its weights before the PDL wait, as the
batch-1 GEMV does. The library's batch-32 GEMV multiplies with tl.dot (three TF32 products a
dot) and reads W after its wait; no other tiling of it makes the step faster
(results/h200/fused/b32_tiles/). Here each program reads BLOCK_N columns of all of K into
registers first, then takes the batch ROWS rows at a time: x's rows (from L2) times the tile,
summed over K with float32 FMAs on the CUDA cores (IEEE, no tensor cores). 32 rows are 32 times
batch 1's FMAs: about 7 us a layer at the H200's float32 peak, near the 6.6 us of the bytes.

Each layer GEMV alone (`step_ab.bench_graph`: 20 calls on 20 copies of W in one CUDA graph),
over ROWS and warps (BLOCK_N as `fused.layer_tiles` has it at batch 1), beside `fused.gemv` with
the library's batch-32 tiles; the largest error of each against float64.
Usage: python tools/probe_b32_rows.py OUT_DIR"""
import itertools
import pathlib
import sys

import pandas as pd
import torch
import triton
import triton.language as tl

from fastgen_lib import fused
from probe_b32_tiles import B, CALLS, SHAPES  # the layer GEMVs, batch 32, 20 copies of W
from step_ab import bench_graph


@triton.jit
def _rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, B, K, N, stride_xb, stride_wk, stride_wn,
                 stride_yb, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 ROWS: tl.constexpr, PDL: tl.constexpr):
    # y [B, N] = x [B, K] @ W [K, N] + b: program n holds W's columns n*BLOCK_N.., all of K
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    k_ok = ks < K
    w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    if PDL:  # W is read; x comes from the kernel ahead
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    for m0 in range(0, B, ROWS):
        rows = m0 + tl.arange(0, ROWS)
        r_ok = rows < B
        x = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :],
                    mask=r_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        y = tl.sum(x[:, :, None] * w[None, :, :], axis=1) + bias[None, :]  # [ROWS, BLOCK_N]
        tl.store(y_ptr + rows[:, None] * stride_yb + cols[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=r_ok[:, None] & col_ok[None, :])


def rows_gemv(x, w, b, out, block_n=16, rows=1, num_warps=4, pdl=False):
    """x [B, K] @ w [K, N] + b into `out`, with `_rows_kernel` (N / block_n programs)."""
    Bx, K = x.shape
    N = w.shape[1]
    _rows_kernel[(triton.cdiv(N, block_n),)](
        x, w, b, out, Bx, K, N, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_K=triton.next_power_of_2(K), BLOCK_N=block_n, ROWS=rows, PDL=pdl,
        num_warps=num_warps, **({"launch_pdl": True} if pdl else {}))
    return out


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (K, N) in SHAPES.items():
        x = torch.randn(B, K, device="cuda")
        ws = [torch.randn(K, N, device="cuda") * K ** -0.5 for _ in range(CALLS)]
        b = torch.randn(N, device="cuda") * 0.1
        y = torch.empty(B, N, device="cuda")
        want = x.double() @ ws[0].double() + b.double()
        block_n = fused.layer_tiles(1, K, N, torch.float32).get("block_n", 16)
        cases = [("library", {})] + [
            (f"rows{r}_w{w}", dict(rows=r, num_warps=w, block_n=block_n))
            for r, w in itertools.product((1, 2, 4), (4, 8, 16))]
        for label, kw in cases:
            def fn(i, kw=kw):
                if not kw:
                    return fused.gemv(x, ws[i], b, out=y)
                return rows_gemv(x, ws[i], b, y, **kw)
            try:
                fn(0)
                err = float((y.double() - want).abs().max())
                us = bench_graph(fn, CALLS)
            except Exception as e:  # out of resources: say so, go on
                print(name, label, type(e).__name__, str(e)[:120], flush=True)
                continue
            rows.append({"name": name, "K": K, "N": N, "kernel": label, **kw, "us": us,
                         "gb_s": K * N * 4 / 1e3 / us, "max_abs_err": err})
            print(rows[-1], flush=True)
        pd.DataFrame(rows).to_csv(out / "gemv_b32_rows.csv", index=False)
    df = pd.DataFrame(rows)
    print(df.sort_values(["name", "us"]).groupby("name").head(3).round(3).to_string(index=False))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

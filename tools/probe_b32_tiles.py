"""Issue 14: the fused step's layer GEMVs at batch 32, float32 (three TF32 products a dot).
`tools/tune_fused.py` tried 64 columns or more, 4 warps, and K always split (its programs per
SM never go below 2); the library keeps 64 x 32 tiles with K in 8 to 32 chunks, and each
column tile's last program reads all of them back: at batch 32 the partial sums are half as
many bytes as the weights. This probe times each GEMV alone (`step_ab.bench_graph`: 20 calls
on 20 copies of the weight in one CUDA graph) over narrower columns, fewer splits, down to
none, and 8 warps; then the step (`FusedStep` under the interleaved driver, prompt 16 mixed,
100 new tokens, alternated, 10 rounds) with each GEMV's fastest tiles (`best`) and its
fastest unsplit ones (`unsplit`) patched into `fused.layer_tiles`, against the library's.
The kernels are compiled first in parallel processes (Triton's disk cache), then timed in
this one.
Usage: python tools/probe_b32_tiles.py OUT_DIR [DTYPE]   (float32, or bfloat16)"""
import concurrent.futures as cf
import itertools
import multiprocessing
import pathlib
import sys

import pandas as pd
import torch

from fastgen_lib import fused
from step_ab import bench_graph, compare_steps, with_attr

SHAPES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072),
          "mlp.c_proj": (3072, 768)}
B = 32
GRID = [dict(block_n=n, block_k=k, split=s, num_warps=w)
        for n, k, s, w in itertools.product((16, 32, 64), (32, 64), (1, 2, 4), (4, 8))]
CALLS = 20


def tiles_list():
    """(name, tiles) to time: gemv's own tiles ("default"), then GRID."""
    return [(name, t) for name in SHAPES for t in [None] + GRID]


def operands(name, dtype):
    K, N = SHAPES[name]
    x = torch.randn(B, K, device="cuda", dtype=dtype)
    ws = [(torch.randn(K, N, device="cuda") * K ** -0.5).to(dtype) for _ in range(CALLS)]
    b = torch.zeros(N, device="cuda", dtype=dtype)
    return x, ws, b, torch.empty(B, N, device="cuda", dtype=dtype)


def call(name, dtype, tiles):
    """fn(i) for bench_graph: gemv on copy i of the weight with `tiles` (None: gemv's own)."""
    x, ws, b, out = operands(name, dtype)
    t = tiles or {}
    tile_args = {k: v for k, v in t.items() if k != "num_warps"}
    K, N = SHAPES[name]
    scratch = (torch.empty(fused.scratch_size(B, K, N, x.device, dtype=dtype, **tile_args),
                           device="cuda"),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device="cuda"))
    return lambda i: fused.gemv(x, ws[i], b, out=out, scratch=scratch, **t)


def compile_some(dtype, items):
    """Runs each (name, tiles) once: Triton compiles it into its disk cache."""
    for name, tiles in items:
        try:
            call(name, dtype, tiles)(0)
        except Exception:  # out of resources: the timing skips it too
            pass
    torch.cuda.synchronize()


def sweep(dtype, workers=8):
    items = tiles_list()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(compile_some, [dtype] * workers, [items[i::workers]
                                                        for i in range(workers)]))
    rows = []
    for name, tiles in items:
        K, N = SHAPES[name]
        row = {"name": name, "K": K, "N": N, **(tiles or {"block_n": "default"})}
        try:
            us = bench_graph(call(name, dtype, tiles), CALLS)
        except Exception as e:
            print(name, tiles, type(e).__name__, flush=True)
            continue
        split = fused.gemv_tiles(B, K, N, torch.device("cuda"), dtype=dtype,
                                 **{k: v for k, v in (tiles or {}).items()
                                    if k != "num_warps"})[3]
        rows.append(row | {"split": split, "us": us,
                           "gb_s": K * N * torch.finfo(dtype).bits / 8 / 1e3 / us})
    return pd.DataFrame(rows)


def fastest(df, unsplit=False):
    """{(K, N): tiles} of each shape's fastest row (among split 1 only, with unsplit)."""
    df = df[df.block_n != "default"]
    if unsplit:
        df = df[df.split == 1]
    best = df.loc[df.groupby("name").us.idxmin()]
    return {(r.K, r.N): dict(block_n=int(r.block_n), block_k=int(r.block_k), split=int(r.split),
                             num_warps=int(r.num_warps)) for r in best.itertuples()}


def patched(by_shape):
    """fused.layer_tiles with `by_shape`'s tiles at batch 32."""
    library = fused.layer_tiles

    def tiles(batch, K, N, dtype):
        return by_shape.get((K, N), {}) if batch == B else library(batch, K, N, dtype)
    return tiles


def main(out, dtype):
    out.mkdir(parents=True, exist_ok=True)
    tag = str(dtype).split(".")[-1]
    df = sweep(dtype)
    df.to_csv(out / f"gemv_b32_{tag}.csv", index=False)
    for name, g in df.groupby("name", sort=False):
        print(g.sort_values("us").head(4).round(2).to_string(index=False), flush=True)
    steps = {"default": fused.FusedStep}
    for label, unsplit in (("best", False), ("unsplit", True)):
        choice = fastest(df, unsplit)
        print(label, choice, flush=True)
        steps[label] = with_attr(fused.FusedStep, label, fused, "layer_tiles", patched(choice))
    compare_steps(steps, (dtype,), (B,), "tiles", same_as="default").to_csv(
        out / f"step_b32_{tag}.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), getattr(torch, sys.argv[2] if len(sys.argv) > 2
                                            else "float32"))

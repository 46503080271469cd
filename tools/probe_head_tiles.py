"""Issue 14, batch 32: the step's lm_head as it runs in the step (ln_f folded in, each column
tile's argmax after, the weight read as lm_head.weight.t(): K contiguous). In the step its
share is 128 µs a step in float32 and 73 in bfloat16 (`tools/probe_step_order.py`), though
alone and without LayerNorm or argmax it takes 65 and 25 (`results/h200/fused/lm_head_tiles/`):
with both, the kernel holds up to 255 registers a thread, two programs an SM, its 786
programs in three waves. Here:
1. the GEMV alone, LN and argmax in (`step_ab.bench_graph`: 20 calls on 20 copies of the
   weight in one CUDA graph), over block_k, block_n and warps, float32 and bfloat16, batch 32;
2. the step (`FusedStep`, interleaved driver, prompt 16 mixed, 100 new tokens, alternated, 10
   rounds) with the two fastest tilings patched into `fused.head_tiles`, against the library's.
It patches `fused.head_tiles` (adopted after this probe: results/h200/fused/head_tiles/).
Usage: python tools/probe_head_tiles.py OUT_DIR"""
import itertools
import pathlib
import sys

import pandas as pd
import torch
import triton

from fastgen_lib import fused
from step_ab import bench_graph, compare_steps, with_attr

B, E, V, CALLS = 32, 768, 50257, 20
GRID = [dict(block_k=k, block_n=n, num_warps=w)
        for k, n, w in itertools.product((16, 32, 64, 128), (32, 64, 128), (4, 8))]


def head_call(dtype, tiles, calls=CALLS):
    """fn(i): the lm_head GEMV on weight copy i, as the step calls it (LN folded, argmax)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(B, E, generator=g).to("cuda", dtype)
    ws = [(torch.randn(V, E, generator=g) * E ** -0.5).to("cuda", dtype) for _ in range(calls)]
    ln = torch.nn.LayerNorm(E, device="cuda", dtype=dtype)
    folds = [fused.fold_layernorm(ln, w.t()) for w in ws]
    bn = fused.gemv_tiles(B, E, V, x.device, block_n=tiles["block_n"])[1]
    top = torch.empty(B, triton.cdiv(V, bn), device="cuda")
    top_i = torch.empty(B, triton.cdiv(V, bn), dtype=torch.int32, device="cuda")
    out = torch.empty(B, V, device="cuda")
    scratch = (torch.empty(1, device="cuda"),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device="cuda"))

    def fn(i):
        return fused.gemv(x, ws[i].t(), folds[i][2], ln=folds[i], out=out,
                          argmax=(top, top_i), scratch=scratch, **tiles)
    return fn


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    rows, best = [], {}
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype)[6:]
        lib = fused.gemv_tiles(B, E, V, torch.device("cuda"), dtype=dtype)
        for tiles in GRID:
            try:
                us = bench_graph(head_call(dtype, tiles))
            except Exception as e:  # out of resources
                print(tag, tiles, type(e).__name__, flush=True)
                continue
            rows.append({"dtype": tag, **tiles, "us": us,
                         "library": (tiles["block_k"], tiles["block_n"], tiles["num_warps"])
                         == (lib[2], lib[1], 4)})
        d = pd.DataFrame(rows)
        d = d[d.dtype == tag].sort_values("us")
        print(d.head(6).round(2).to_string(index=False), "\n", d[d.library].round(2).to_string(
            index=False), flush=True)
        best[dtype] = [{k: int(r[k]) for k in GRID[0]} for _, r in d.head(2).iterrows()]
    pd.DataFrame(rows).to_csv(out / "head_b32.csv", index=False)
    frames = []
    for dtype, choices in best.items():
        steps = {"library": fused.FusedStep}
        library = fused.head_tiles
        for i, choice in enumerate(choices):
            def tiles(b, dt, choice=choice):
                return choice if b == B else library(b, dt)
            name = "k{block_k}_n{block_n}_w{num_warps}".format(**choice)
            steps[name] = with_attr(fused.FusedStep, name, fused, "head_tiles", tiles)
        frames.append(compare_steps(steps, (dtype,), (B,), "head", same_as="library"))
    pd.concat(frames).to_csv(out / "step_head_b32.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

"""Tiles for the fused step's GEMV (fastgen_lib/fused.py) at GPT-2 124M's five shapes, on the GPU:
each (block_n, block_k, programs_per_sm) timed as the step runs it, inside a CUDA graph (20 calls
on 20 copies of the weight, so that they are read from memory, not from L2; one scratch: no host
launch and no allocation in the time), the graph's replay timed by
triton.testing.do_bench (median, L2 flushed before each replay), batch 1 and 32, float32 and
bfloat16, beside cuBLAS (torch.addmm) captured alike; bandwidth is the weight's bytes over the time.
With `defaults`, the batch-1 GEMVs that the step runs with K contiguous (`fused.step_weights`: QKV,
c_fc, mlp.c_proj) read such copies; cuBLAS reads GPT-2's Conv1D layout, as the model does.
Usage: python tools/tune_fused.py OUT_CSV [defaults] [SHAPE ...]   (defaults: only the step's
tiles; SHAPE: only these of SHAPES, e.g. lm_head)"""
import itertools
import sys

import pandas as pd
import torch

from fastgen_lib import fused
from step_ab import bench_graph

SHAPES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072),
          "mlp.c_proj": (3072, 768), "lm_head": (768, 50257)}
GRID = list(itertools.product((32, 64, 128), (32, 64, 128), (2, 4, 8)))
DEFAULTS = "defaults" in sys.argv[2:]  # only the library's tiles (`fused.layer_tiles`, else gemv's)
SHAPES = {n: s for n, s in SHAPES.items() if n in sys.argv[2:]} or SHAPES
rows = []


CALLS = 20


for dtype, B, (name, (K, N)) in itertools.product((torch.float32, torch.bfloat16), (1, 32),
                                                  SHAPES.items()):
    x = torch.randn(B, K, device="cuda", dtype=dtype)
    w = (torch.randn(K, N, device="cuda") * K ** -0.5).to(dtype)
    if name == "lm_head":  # wte [V, E], read transposed
        w = w.t().contiguous().t()
    ws = [w.clone() if name != "lm_head" else w.t().clone().t() for _ in range(CALLS)]
    b = torch.zeros(N, device="cuda", dtype=dtype)
    out = torch.empty(B, N, device="cuda", dtype=dtype)
    base = {"dtype": str(dtype)[6:], "batch": B, "name": name, "K": K, "N": N}
    gb = K * N * w.element_size() / 1e3
    us = bench_graph(lambda i: torch.addmm(b, x, ws[i], out=out), CALLS)
    rows.append({**base, "kernel": "cublas", "us": us, "gb_s": gb / us})
    grid = [(bn, bk, pps, 4) for bn, bk, pps in GRID]
    if DEFAULTS:  # the step's tiles: a layer's from layer_tiles, the lm_head's from head_tiles
        t = fused.layer_tiles(B, K, N, dtype) if name != "lm_head" else fused.head_tiles(B, dtype)
        bk, pps = fused.default_tiles(B, dtype)
        grid = [(t.get("block_n", 64), t.get("block_k", bk), pps, t.get("num_warps", 4))]
    wk = ws  # the weights as the step reads them: at batch 1, K contiguous (fused.step_weights)
    if DEFAULTS and B == 1 and name in ("c_attn", "c_fc", "mlp.c_proj"):
        wk = [v.t().contiguous().t() for v in ws]
    for bn, bk, pps, warps in grid:
        need = fused.scratch_size(B, K, N, x.device, block_n=bn, block_k=bk, programs_per_sm=pps)
        scratch = (torch.empty(need, device="cuda"),
                   torch.zeros(fused.LOCKS, dtype=torch.int32, device="cuda"))

        def fn(i):
            return fused.gemv(x, wk[i], b, out=out, block_n=bn, block_k=bk, programs_per_sm=pps,
                              scratch=scratch, num_warps=warps)
        try:
            us = bench_graph(fn, CALLS)
        except Exception as e:  # out of resources: skip that one
            print(name, B, bn, bk, pps, type(e).__name__, flush=True)
            continue
        split = fused.gemv_tiles(B, K, N, x.device, bn, bk, pps)[3]
        rows.append({**base, "kernel": "fused", "block_n": bn, "block_k": bk,
                     "programs_per_sm": pps, "num_warps": warps, "split": split, "us": us,
                     "gb_s": gb / us})
    df = pd.DataFrame(rows)
    mine = df[(df.name == name) & (df.batch == B) & (df.dtype == base["dtype"])]
    print(mine.sort_values("us").head(2).to_string(index=False), flush=True)
    df.to_csv(sys.argv[1], index=False)  # after each shape: a cut run keeps them

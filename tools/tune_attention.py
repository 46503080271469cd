"""Tiles for the fused step's attention (fastgen_lib/fused.py) at GPT-2 124M's shapes, on the GPU:
each (block_s, num_warps) timed as the step runs it, inside a CUDA graph (20 calls on 20 copies of
the cache, so that they are read from memory, not from L2; one scratch), the graph's replay timed
by triton.testing.do_bench (median, L2 flushed before each replay): batch 1 and 32, float32 and
bfloat16, a cache of 116 slots (prompt 16 + 100 new tokens) read up to column 16 or 115 (a call's
first and last step). Bandwidth is the keys' and values' used bytes over the time.
Usage: python tools/tune_attention.py OUT_CSV"""
import itertools
import sys

import pandas as pd
import torch

from fastgen_lib import fused
from step_ab import bench_graph

H, D, L, CALLS = 12, 64, 116, 20
GRID = list(itertools.product((16, 32, 64, 128), (1, 2, 4, 8)))
DEFAULTS = (32, 2)  # fused.attention's block_s and num_warps
rows = []


for dtype, B, c in itertools.product((torch.float32, torch.bfloat16), (1, 32), (16, 115)):
    q = torch.randn(B, H * D, device="cuda", dtype=dtype)
    kv = [torch.randn(2, B, H, L, D, device="cuda", dtype=dtype) for _ in range(CALLS)]
    mask = torch.ones(B, L, dtype=torch.long, device="cuda")
    col = torch.tensor(c, device="cuda")
    out = torch.empty(B, H * D, device="cuda", dtype=dtype)
    scratch = (torch.empty(B * H * L * (D + 2), device="cuda"),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device="cuda"))
    want = fused.attention(q, kv[0][0], kv[0][1], mask, col)
    base = {"dtype": str(dtype)[6:], "batch": B, "col": c}
    gb = 2 * B * H * (c + 1) * D * q.element_size() / 1e3
    for bs, warps in GRID:
        def fn(i):
            return fused.attention(q, kv[i][0], kv[i][1], mask, col, out=out, scratch=scratch,
                                   block_s=bs, num_warps=warps)
        try:
            us = bench_graph(fn, CALLS)
        except Exception as e:  # out of resources: skip that one
            print(base, bs, warps, type(e).__name__, flush=True)
            continue
        fn(0)
        torch.testing.assert_close(out, want, rtol=1e-3 if dtype == torch.float32 else 2e-2,
                                   atol=1e-4 if dtype == torch.float32 else 2e-2)
        splits = fused.attention_blocks(L, bs)[1]
        rows.append({**base, "block_s": bs, "num_warps": warps, "splits": splits,
                     "default": (bs, warps) == DEFAULTS, "us": us, "gb_s": gb / us})
    df = pd.DataFrame(rows)
    mine = df[(df.batch == B) & (df.col == c) & (df.dtype == base["dtype"])]
    print(pd.concat([mine[mine.default], mine.sort_values("us").head(3)]).to_string(index=False),
          flush=True)
    df.to_csv(sys.argv[1], index=False)  # after each case: a cut run keeps them
    del kv
    torch.cuda.empty_cache()

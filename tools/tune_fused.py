"""Block sizes for the fused step's GEMV kernel (fastgen_lib/fused.py) at GPT-2 124M's shapes, on the
GPU: every (block_n, block_k, num_warps) timed with triton.testing.do_bench (median, ms), batch 1 and
32, float32 and bfloat16, and the achieved bandwidth (weight bytes over time).
Usage: python tools/tune_fused.py OUT_CSV"""
import itertools
import sys

import pandas as pd
import torch
import triton

from fastgen_lib import fused

SHAPES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072),
          "mlp.c_proj": (3072, 768)}
rows = []
for dtype, B, (name, (K, N)) in itertools.product((torch.float32, torch.bfloat16), (1, 32),
                                                  SHAPES.items()):
    x = torch.randn(B, K, device="cuda", dtype=dtype)
    w = (torch.randn(K, N, device="cuda") * K ** -0.5).to(dtype)
    b = torch.zeros(N, device="cuda", dtype=dtype)
    r = torch.randn(B, N, device="cuda", dtype=dtype)
    for bn, bk, nw in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (2, 4, 8)):
        def fn():
            return fused.gemv_bias_residual(x, w, b, r, block_n=bn, block_k=bk, num_warps=nw)
        try:
            ms = triton.testing.do_bench(fn, warmup=10, rep=40)
        except Exception as e:  # out of resources: skip that one
            print(name, B, bn, bk, nw, type(e).__name__, flush=True)
            continue
        rows.append({"dtype": str(dtype)[6:], "batch": B, "name": name, "K": K, "N": N,
                     "block_n": bn, "block_k": bk, "num_warps": nw, "us": ms * 1e3,
                     "gb_s": K * N * w.element_size() / ms / 1e6})
    best = min((r_ for r_ in rows if r_["name"] == name and r_["batch"] == B
                and r_["dtype"] == str(dtype)[6:]), key=lambda r_: r_["us"])
    print(best, flush=True)
    pd.DataFrame(rows).to_csv(sys.argv[1], index=False)  # after each shape: a cut run keeps them

"""Kernels and GPU busy time per decode step, from a profiler trace (issue 14: the fused step against
the compiled ones). Per decoder, batch and dtype: one call of 1 new token and one of N, profiled; the
difference over N - 1 steps is the decode step's share. Run it in its own process, after any timing
(a profiler session slows later host-bound steps: chapter 7).
Usage: PYTHONPATH=. python lab/probe_kernels.py OUT_CSV [decoder ...]"""
import sys

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import measure, traces

out = sys.argv[1]
methods = sys.argv[2:] or ["compiled", "interleaved", "fused"]
N, rows = 100, []
for dtype in (torch.float32, torch.bfloat16):
    model = fg.load_model("124m", device="cuda", dtype=dtype)
    for batch in (1, 32):
        ids, mask = fg.make_batch(batch, 16, seed=batch, device="cuda")
        for method in methods:
            call = measure.decoder_call(model, ids, mask, method, N)
            call(), call(1)  # compile, capture, warm
            iv = {n: traces.profile_decode(lambda n=n: call(n)) for n in (1, N)}
            gaps = {n: traces.gpu_gaps(iv[n]) for n in (1, N)}
            kernels = {n: int((iv[n].cat == "kernel").sum()) for n in (1, N)}
            rows.append({"method": method, "batch": batch, "dtype": str(dtype)[6:],
                         "kernels_per_step": (kernels[N] - kernels[1]) / (N - 1),
                         "busy_us_per_step": (gaps[N]["busy_us"] - gaps[1]["busy_us"]) / (N - 1)})
            print(rows[-1], flush=True)
    del model
    torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(out, index=False)

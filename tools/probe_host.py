"""Why do the eager (host-bound) decoders time differently from chapter to chapter? In one process:
the eager ladder (and `compiled`, `interleaved`) at batch 1, fresh, then after a few profiler
sessions. Run it in fresh processes with different settings, e.g. TEARDOWN_CUPTI=1 (kineto then
finalizes CUPTI when a trace ends). Usage: python tools/probe_host.py LABEL [cpu|cuda|both] [OUT_CSV]"""
import sys

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

import fastgen_lib as fg
from fastgen_lib import measure

label, acts = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "both")
model = fg.load_model("124m", device="cuda")
ids, mask = fg.make_batch(1, 16, device="cuda", tokenizer=fg.load_tokenizer("124m"))
METHODS = ["naive", "static_cache", "compiled", "interleaved"]
rows = []


def point(when):
    for r in measure.measure_decoders(model, ids, mask, METHODS, 100, repeats=10):
        rows.append({"process": label, "profiler": acts, "when": when, "method": r["method"],
                     "ms_per_step": r["ms_per_step"], "q1": r["ms_per_step_q1"],
                     "q3": r["ms_per_step_q3"]})


point("fresh")
activities = {"cpu": [ProfilerActivity.CPU], "cuda": [ProfilerActivity.CUDA],
              "both": [ProfilerActivity.CPU, ProfilerActivity.CUDA]}[acts]
for d in ["naive", "compiled", "interleaved"]:  # three sessions, as a chapter runs them
    with profile(activities=activities):
        fg.generate(model, ids, mask, decoder=d, max_new_tokens=20)
        torch.cuda.synchronize()
point("after 3 profiler sessions")
df = pd.DataFrame(rows)
print(df.round(3).to_string(), flush=True)
if len(sys.argv) > 3:
    df.to_csv(sys.argv[3], index=False)

"""Why chapter 1's naive step at batch 1 takes more GPU time at n = 16 tokens than at n = 32:
each kernel of one step, profiled, at batch 1 and 4 and n = 16, 32, 64 (as chapter 1 builds them),
each length twice (in order, then again in reverse) to tell a shape's cost from an order effect.
Usage: python tools/probe_step_kernels.py OUT_DIR"""
import sys
import warnings
from collections import defaultdict

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import fastgen_lib as fg
from fastgen_lib import measure
from fastgen_lib.steps import forward, positions

out = sys.argv[1]
model = fg.load_model("124m", device="cuda")
LENGTHS = [16, 32, 64]
fns = {}
for b in (1, 4):
    ids, mask = fg.make_batch(b, 1024, mixed=False, seed=b, device=model.device)
    pos = positions(mask)
    for n in LENGTHS:
        fns[b, n] = (lambda n=n, x=ids, m=mask, p=pos: forward(model, x[:, :n], m[:, :n], p[:, :n]))


def kernels(fn, calls=3):
    """{kernel name: µs per call} over `calls` profiled calls, after one unprofiled call."""
    fn()
    measure.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            measure.sync()
    per = defaultdict(float)
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == DeviceType.CUDA:
            per[e.name()[:90]] += e.duration_ns() / 1e3 / calls
    return per


rows = []
with torch.inference_mode():
    for f in fns.values():  # warm every shape
        f()
    order = list(fns) + list(reversed(fns))
    for i, key in enumerate(order):
        for name, us in kernels(fns[key]).items():
            rows.append({"pass": 1 if i < len(fns) else 2, "batch": key[0], "n": key[1],
                         "kernel": name, "us": us})
d = pd.DataFrame(rows)
d.to_csv(f"{out}/step_kernels.csv", index=False)
tot = d.groupby(["pass", "batch", "n"]).us.sum().unstack("pass")
print("GPU µs per step (pass 1 in order, pass 2 reversed):\n", tot.round(1).to_string())
for b in (1, 4):
    p = d[(d["pass"] == 1) & (d.batch == b)].pivot_table(index="kernel", columns="n",
                                                         values="us", aggfunc="sum")
    p = p.fillna(0).sort_values(16, ascending=False)
    print(f"\nbatch {b}, pass 1, µs per step, top kernels:")
    with pd.option_context("display.width", 200, "display.max_colwidth", 90):
        print(p.head(14).round(1).to_string())

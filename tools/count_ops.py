"""Torch ops a `kv_cache` decode step dispatches from Python, at batch 1 (a prompt without padding)
and at left-padded batches: the host's work per step, which sets an eager step's pace (chapter 2,
exercise 3). Counted with the profiler on the CPU; on a GPU each op that computes is also a
kernel launch. One call of 2 new tokens and one of 12; the difference over 10 steps is a decode
step's share.
Usage: python tools/count_ops.py OUT_CSV [size]   (size: tiny or 124m; default 124m)"""
import collections
import sys

import pandas as pd
from torch.profiler import ProfilerActivity, profile

import fastgen_lib as fg


def ops(model, ids, mask, n):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=n)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


out, size = sys.argv[1], (sys.argv[2:] or ["124m"])[0]
model = fg.load_model(size)
rows = []
for batch in (1, 8, 32):
    ids, mask = fg.make_batch(batch, 16, seed=batch)  # as exercise 3's prompts
    fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=2)  # warm
    short, long = ops(model, ids, mask, 2), ops(model, ids, mask, 12)
    per_step = {k: (long[k] - short[k]) / 10 for k in long}
    rows.append({"batch": batch, "padded_rows": int((mask == 0).any(1).sum()),
                 "ops_per_step": sum(per_step.values()),
                 "where_per_step": per_step.get("aten::where", 0.0)})
    print(rows[-1], flush=True)
pd.DataFrame(rows).to_csv(out, index=False)

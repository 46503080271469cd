"""Issue 14: what holds the fused step, kernel by kernel, in the order the step runs them. One
call of N new tokens with `fused`, profiled; each decode step is one CUDA-graph launch (its
kernels share a correlation id). For each kernel of a step: its own duration, and its share of
the step's critical path, end_i - end_(i-1) (under PDL a kernel starts before the one ahead
ends, so its own duration overlaps its neighbour's; the end-to-end share does not). Medians over
the steps, then summed by role: each layer GEMV (c_attn, attn.c_proj, c_fc, mlp.c_proj), the
attention (at batch 1 with attn.c_proj in it), the lm_head and the token choice; plus the gap
between steps. Batch 1 and 32, float32 and bfloat16, prompt 16 (mixed), 100 new tokens.
With `late_kv` (a second argument), batch 32 only, the library's step beside one whose
attention reads the whole cache after its wait (`attention(early_kv=False)`): does the
attention's early read of the cache slow `c_attn`, the kernel it overlaps?
Usage: python tools/probe_step_order.py OUT_DIR [late_kv]"""
import pathlib
import sys

import numpy as np
import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import decoders, fused, measure, traces

N = 100
ROLES = {1: ["c_attn", "attention+attn.c_proj", "c_fc", "mlp.c_proj"],
         32: ["c_attn", "attention", "attn.c_proj", "c_fc", "mlp.c_proj"]}


def role(i, batch, layers):
    per = ROLES[batch]
    if i < layers * len(per):
        return per[i % len(per)]
    return ["lm_head", "token choice"][i - layers * len(per)]


def step_kernels(iv, batch, layers):
    """One row per (step, kernel): position, role, duration and end-to-end share, µs."""
    iv = iv[iv.cat == "kernel"]
    steps = traces.step_spans(iv)
    rows = []
    want = layers * len(ROLES[batch]) + 2
    for c, g in iv.groupby("correlation", sort=False):
        if len(g) != want:
            continue
        g = g.sort_values("start_us")
        ends = g.end_us.to_numpy()
        share = np.diff(ends, prepend=g.start_us.iloc[0])
        for i, (name, dur, sh) in enumerate(zip(g.name, g.end_us - g.start_us, share)):
            rows.append({"step": c, "i": i, "role": role(i, batch, layers), "kernel": name[:40],
                         "us": dur, "share_us": sh})
    return pd.DataFrame(rows), steps


def profile_step(model, batch, dtype, label, summary, per_kernel):
    """Profile one 100-token call of `fused`, print and record each role's share."""
    layers = model.config.n_layer
    ids, mask = fg.make_batch(batch, 16, seed=batch, device="cuda")
    call = measure.decoder_call(model, ids, mask, "fused", N)
    call(), call()  # capture, warm
    d, steps = step_kernels(traces.profile_decode(call), batch, layers)
    d = d.groupby(["i", "role", "kernel"], as_index=False)[["us", "share_us"]].median()
    tags = {"variant": label, "batch": batch, "dtype": str(dtype)[6:]}
    per_kernel.append(d.assign(**tags))
    gaps = steps.start_us.iloc[1:].to_numpy() - steps.end_us.iloc[:-1].to_numpy()
    by = d.groupby("role")[["us", "share_us"]].sum()
    step_us = float((steps.end_us - steps.start_us).median())
    print(f"{label}, batch {batch} {str(dtype)[6:]}: {len(steps)} steps, step span {step_us:.1f}"
          f" µs, gap between steps {np.median(gaps):.1f} µs\n{by.round(1).to_string()}\n"
          f"  sum of shares {d.share_us.sum():.1f}", flush=True)
    summary += [tags | {"role": r, "us": v.us, "share_us": v.share_us} for r, v in by.iterrows()]
    summary += [tags | {"role": "step span", "us": step_us, "share_us": step_us},
                tags | {"role": "gap between steps", "us": float(np.median(gaps)),
                        "share_us": float(np.median(gaps))}]


def main(out, late_kv=False):
    out.mkdir(parents=True, exist_ok=True)
    per_kernel, summary = [], []
    for dtype in (torch.float32, torch.bfloat16):
        model = fg.load_model("124m", device="cuda", dtype=dtype)
        for batch in ((32,) if late_kv else (1, 32)):
            profile_step(model, batch, dtype, "library", summary, per_kernel)
            if late_kv:
                library = fused.attention
                fused.attention = lambda *a, **k: library(*a, **(k | {"early_kv": False}))
                decoders.reset(model)  # the step's graphs captured again, with this attention
                try:
                    profile_step(model, batch, dtype, "late_kv", summary, per_kernel)
                finally:
                    fused.attention = library
                    decoders.reset(model)
        del model
        torch.cuda.empty_cache()
    tag = "_late_kv" if late_kv else ""
    pd.concat(per_kernel).to_csv(out / f"step_order_kernels{tag}.csv", index=False)
    pd.DataFrame(summary).to_csv(out / f"step_order{tag}.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "late_kv")

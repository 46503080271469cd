"""GPU work from a profiler trace: the intervals a decoder launched, the GPU's busy and idle time, the
gaps between decode steps (a host-side check's stall), busy time per step and the kernels that take it.
Book: chapters 2, 4-8; the CLI's `profile` command."""
import json
import os
import warnings

import numpy as np
import pandas as pd
import torch

from .measure import sync


def profile_trace(fn, path=None):
    """Profile `fn()` (CPU + CUDA activities, the GPU synchronized at the end) and return its Chrome
    trace as a dict. `path` keeps the trace file (open it in Perfetto)."""
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with warnings.catch_warnings():  # the profiler's notes about its own event buffers
        warnings.simplefilter("ignore")
        with profile(activities=acts) as prof:
            fn()
            sync()
    path = path or os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return json.load(f)


def profile_decode(fn, path=None):
    """Profile `fn()` and return the GPU work that the decoder launched, as a DataFrame of
    intervals: name, stream, start_us, end_us (kernels, memcpys and memsets from the Kineto trace,
    kept only if launched inside `generate`'s "fastgen.<decoder>" range, so input checks and the
    caller's own work stay out). `path` keeps the Chrome trace (open it in Perfetto)."""
    return trace_intervals(profile_trace(fn, path), annotation="fastgen.")


def kernel_ms_per_step(fn, steps):
    """GPU time per decode step: profile `fn()` and sum the time the GPU was busy with the decoder's
    work (kernels, copies; overlapping intervals merged), over `steps`. Beside the wall time per step,
    it says whether a loop is bound by the GPU's work or by the host that feeds it.
    fn may be {decoder: function calling `generate` with it}: all in one profiler session, then
    {decoder: ms} (each call's work told apart by its "fastgen.<decoder>" range). One session
    attaches CUPTI once: with TEARDOWN_CUPTI=1 none stays to slow the host afterwards."""
    if not isinstance(fn, dict):
        return gpu_gaps(profile_decode(fn))["busy_us"] / steps / 1e3
    trace = profile_trace(lambda: [f() for f in fn.values()])
    return {d: gpu_gaps(trace_intervals(trace, annotation=f"fastgen.{d}"))["busy_us"] / steps / 1e3
            for d in fn}


def trace_intervals(trace, annotation=None):
    """GPU intervals from a Chrome/Kineto trace dict: events of category kernel, gpu_memcpy or gpu_memset,
    sorted by start (microseconds). With `annotation`, only those whose launch (matched by correlation id)
    happened on the host inside a user annotation whose name starts with it."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if annotation is not None:
        ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "user_annotation" and e.get("name", "").startswith(annotation)]
        launches = {e["args"]["correlation"] for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
                    and any(a <= e["ts"] <= b for a, b in ranges)}
        gpu = [e for e in gpu if e.get("args", {}).get("correlation") in launches]
    rows = [(e.get("name", ""), e.get("args", {}).get("stream", e.get("tid")), e["ts"], e["ts"] + e["dur"],
             e["cat"], e.get("args", {}).get("correlation")) for e in gpu]
    df = pd.DataFrame(rows, columns=["name", "stream", "start_us", "end_us", "cat", "correlation"])
    return df.sort_values("start_us").reset_index(drop=True)


def gpu_gaps(intervals, steps=None, min_gap_us=0.0):
    """Idle time of the GPU between its first and last piece of work: merge overlapping intervals (any
    stream), then sum the gaps. Returns total busy/idle microseconds, busy fraction, the gaps themselves,
    and idle per step if `steps` is given."""
    iv = intervals.sort_values("start_us")[["start_us", "end_us"]].to_numpy()
    if len(iv) == 0:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "busy_fraction": float("nan"), "gaps_us": []}
    merged = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:]) if b[0] - a[1] > min_gap_us]
    span = merged[-1][1] - merged[0][0]
    busy = sum(e - s for s, e in merged)
    out = {"span_us": span, "busy_us": busy, "idle_us": span - busy,
           "busy_fraction": busy / span if span else 1.0, "gaps_us": gaps,
           "largest_gap_us": max(gaps) if gaps else 0.0}
    if steps:
        out["idle_per_step_us"] = out["idle_us"] / steps
    return out


def step_spans(intervals, min_kernels=8):
    """Decode steps in a trace of a graph-replaying decoder: all kernels of one CUDA-graph launch share
    the launch's correlation id, so each group of >= `min_kernels` is one step. Returns a DataFrame of
    steps (start_us, end_us, kernels), in time order."""
    g = intervals.groupby("correlation").agg(start_us=("start_us", "min"), end_us=("end_us", "max"),
                                             kernels=("name", "size"))
    return g[g.kernels >= min_kernels].sort_values("start_us").reset_index(drop=True)


def between_steps(intervals, min_kernels=8):
    """Idle time *between* decode steps (the stall a host-side check causes), apart from the small
    bubbles between kernels inside a step: gaps between consecutive step spans, their sum, and the share
    of the decode loop's span that lies inside steps. kernels_per_step is a mean: the interleaved
    driver alternates two graphs (of 161 and 159 kernels for GPT-2: a median would say 161)."""
    steps = step_spans(intervals, min_kernels)
    if len(steps) < 2:
        return {"steps": len(steps), "kernels_per_step": float(steps.kernels.mean()) if len(steps) else 0}
    gaps = (steps.start_us.iloc[1:].to_numpy() - steps.end_us.iloc[:-1].to_numpy()).clip(min=0)
    span = steps.end_us.iloc[-1] - steps.start_us.iloc[0]
    return {"steps": len(steps), "kernels_per_step": float(steps.kernels.mean()),
            "step_us_median": float((steps.end_us - steps.start_us).median()),
            "gap_between_steps_us_median": float(np.median(gaps)),
            "gap_between_steps_us_total": float(gaps.sum()),
            "in_steps_fraction": float(1 - gaps.sum() / span)}


def top_kernels(intervals, k=12):
    """Where GPU time goes: total microseconds, count and mean per kernel name, largest first."""
    d = intervals.assign(us=intervals.end_us - intervals.start_us)
    t = d.groupby("name").us.agg(["sum", "count", "mean"]).sort_values("sum", ascending=False)
    t["share"] = t["sum"] / t["sum"].sum()
    t.index = [n[:70] for n in t.index]
    return t.head(k)

"""The CUDA caching allocator: how fragmented one run leaves it (peaks, inactive split bytes, segments,
retries), its allocated-vs-reserved timeline, and allocator settings (PYTORCH_ALLOC_CONF), which only a
fresh process can apply. Book: chapters 2-4; the CLI's `memory` command."""
import json
import os
import subprocess
import sys

import pandas as pd
import torch

from .measure import sync

FRAG_KEYS = {
    "peak_allocated_mb": "allocated_bytes.all.peak",
    "peak_reserved_mb": "reserved_bytes.all.peak",
    "peak_inactive_split_mb": "inactive_split_bytes.all.peak",
}


def memory_run(fn, history=True):
    """Run `fn()` on a clean allocator and report fragmentation: peak allocated and reserved, their
    difference, inactive split bytes, segments and allocation retries (`torch.cuda.memory_stats`), and
    with `history` the allocator's event trace turned into an allocated-vs-reserved timeline.
    "Peak" starts from what the allocator already holds: `empty_cache` frees only wholly free segments, so
    in a process that ran other work first the peaks include its leftovers. The `before_*` columns say how
    much (on the H200, a notebook kernel held ~1 GB of inactive split before its measured run); a fresh
    process (`fresh_process`) starts clean."""
    if not torch.cuda.is_available():
        raise RuntimeError("memory_run needs CUDA: the caching allocator is what it measures")
    sync()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_stats()
    if history:
        # context=None: no Python/C++ stacks per event, which would make the snapshot slow to build
        torch.cuda.memory._record_memory_history(max_entries=200_000, context=None)
    fn()
    sync()
    stats = torch.cuda.memory_stats()
    timeline = None
    if history:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        timeline = allocator_timeline(snap)
    mb = 2**20
    out = {k: stats.get(v, 0) / mb for k, v in FRAG_KEYS.items()}
    out["peak_reserved_minus_allocated_mb"] = out["peak_reserved_mb"] - out["peak_allocated_mb"]
    out["before_reserved_minus_allocated_mb"] = (base.get("reserved_bytes.all.current", 0)
                                                 - base.get("allocated_bytes.all.current", 0)) / mb
    out["before_inactive_split_mb"] = base.get("inactive_split_bytes.all.current", 0) / mb
    out["segments"] = stats.get("segment.all.current", 0)
    out["segment_allocs"] = stats.get("segment.all.allocated", 0) - base.get("segment.all.allocated", 0)
    out["alloc_retries"] = stats.get("num_alloc_retries", 0) - base.get("num_alloc_retries", 0)
    out["expandable_segments"] = any(s.get("is_expandable") for s in torch.cuda.memory_snapshot())
    return out, timeline


def allocator_timeline(snapshot):
    """Replay the allocator's recorded events into a DataFrame: event index, allocated and reserved bytes.
    (alloc/free of blocks move `allocated`; segment alloc/free/map/unmap move `reserved`.)"""
    rows, alloc, reserved = [], 0, 0
    start = sum(s["total_size"] for s in snapshot.get("segments", []))  # reserved at the end of the run
    events = [e for trace in snapshot.get("device_traces", []) for e in trace]
    delta = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1), "segment_free": (0, -1),
             "segment_map": (0, 1), "segment_unmap": (0, -1)}
    for i, e in enumerate(events):
        da, dr = delta.get(e["action"], (0, 0))
        alloc += da * e["size"]
        reserved += dr * e["size"]
        rows.append((i, alloc, reserved))
    df = pd.DataFrame(rows, columns=["event", "allocated", "reserved"])
    if len(df):  # the trace starts mid-life: shift so that the end matches the snapshot's segments
        df["reserved"] += start - df["reserved"].iloc[-1]
        df["allocated"] -= df["allocated"].min()
    return df


def fresh_process(alloc_conf, args, timeout=600):
    """Run `python -m fastgen_lib memory <args>` in a new process with PYTORCH_ALLOC_CONF=`alloc_conf`
    (the allocator reads it once, when CUDA starts, so it needs a fresh process). Returns the child's JSON
    result, which includes whether expandable segments really were in use there."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf:
        env["PYTORCH_ALLOC_CONF"] = alloc_conf
    else:
        env.pop("PYTORCH_ALLOC_CONF", None)
    cmd = [sys.executable, "-m", "fastgen_lib", "memory", "--json", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    want = "expandable_segments:true" in (alloc_conf or "").replace(" ", "").lower()
    result["alloc_conf"] = alloc_conf or "default"
    result["setting_took_effect"] = result["expandable_segments"] == want
    return result

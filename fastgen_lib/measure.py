"""How every chapter measures: one timing protocol, memory fragmentation, allocator settings in fresh
processes, GPU idle gaps from a profiler trace, and the memory-bandwidth floor. Book: chapters 1-3, 6, 8."""
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np
import pandas as pd
import torch
import transformers

from .decoders import attention_choice, generate

BENCH_VERSION = 2  # bump when the timing method changes (2: alternated rounds, prefill apart, IQR)
COMPILED_STEP = {"compiled", "deferred", "interleaved"}  # their attention: `decode_attention`


# --- conditions ------------------------------------------------------------------------------------------

def conditions(model=None):
    """What a number depends on: GPU, versions, dtype, allocator settings. Every result row carries it."""
    cuda = torch.cuda.is_available()
    c = {
        "gpu": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "",
        "bench_version": BENCH_VERSION,
    }
    if model is not None:
        c["dtype"] = str(model.dtype).replace("torch.", "")
        c["weights"] = getattr(model, "fastgen_weights", "?")
        c["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
        c["decode_attention"] = attention_choice(model.dtype)  # the compiled step's, by default
    return c


def sync(device=None):
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()  # host waits for the GPU here: a timer must not stop before the GPU does


# --- timing ---------------------------------------------------------------------------------------------

def time_call(fn, repeats=10, warmup=1):
    """Wall time of `fn()` in seconds: `warmup` untimed calls (compile, graph capture, lazy init), then
    `repeats` timed calls, each between two synchronizations, the garbage collector off.
    Returns (list of seconds, last result). To compare methods, use `compare`: it alternates them."""
    times, out = compare({"fn": fn}, repeats, warmup)
    return times["fn"], out["fn"]


def compare(calls, repeats=10, warmup=1):
    """The book's timing protocol. `calls` maps names to functions. Each is called `warmup` times
    (compile, capture, lazy init), then `repeats` rounds run every call once, in turn (A B C A B C ...),
    so that a slow moment of the machine hits all methods alike. Each call is timed between two
    synchronizations, with the garbage collector off. Returns ({name: [seconds]}, {name: last result})."""
    out = {}
    for _ in range(warmup):
        for name, fn in calls.items():
            out[name] = fn()
    sync()
    times = {name: [] for name in calls}
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside a timed call would be charged to whichever method ran then
    try:
        for _ in range(repeats):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                out[name] = fn()
                sync()  # host waits for the GPU here: the timer stops when the GPU has finished
                times[name].append(time.perf_counter() - t0)
    finally:
        if enabled:
            gc.enable()
    return times, out


def spread(values):
    """(median, first quartile, third quartile) of a list of numbers."""
    q1, med, q3 = np.percentile(np.asarray(values, float), [25, 50, 75])
    return float(med), float(q1), float(q3)


def decoder_call(model, input_ids, attention_mask, decoder, max_new_tokens, **gen_kwargs):
    """`call(n)`: `generate` with `n` new tokens, on a cache sized for `max_new_tokens` (the same
    cache length, so `call(1)` is the prefill of `call(max_new_tokens)`)."""
    L = gen_kwargs.pop("max_cache_len", None) or input_ids.shape[1] + max_new_tokens

    def call(n=max_new_tokens):
        return generate(model, input_ids, attention_mask, decoder=decoder, max_new_tokens=n,
                        max_cache_len=L, **gen_kwargs)
    call.decode_attention = (attention_choice(model.dtype, gen_kwargs.get("decode_attention", "auto"))
                             if decoder in COMPILED_STEP else model.config._attn_implementation)
    return call


def measure_calls(model, input_ids, calls, max_new_tokens, repeats=10, warmup=1):
    """Time methods side by side. `calls` maps a method name to `call(n)`, which generates `n` new
    tokens. For each method, `call(max_new_tokens)` and `call(1)` are timed, all alternated (`compare`).
    `call(1)` is the time to first token (the prefill and one token choice); the decode time per step
    is the difference, over the other steps, taken round by round. Returns (rows, {method: tokens})."""
    first_s = {}
    for m, c in calls.items():  # the first call of each holds its compile: reported apart
        t0 = time.perf_counter()
        c()
        sync()
        first_s[m] = time.perf_counter() - t0
    timed = {}
    for m, c in calls.items():
        timed[m] = c
        if max_new_tokens > 1:
            timed[f"{m}@1"] = lambda c=c: c(1)
    times, outs = compare(timed, repeats, warmup)
    rows = [_row(model, input_ids, max_new_tokens, m, times[m], times.get(f"{m}@1", times[m]),
                 outs[m], first_s[m], getattr(calls[m], "decode_attention", None)) for m in calls]
    return rows, {m: outs[m] for m in calls}


def measure(model, input_ids, attention_mask, decoder, max_new_tokens, repeats=10, warmup=1,
            **gen_kwargs):
    """One decoder on one batch, by the book's protocol: a row of the conditions, the workload, the
    whole call (median and quartiles, seconds), the time to first token, the decode time per step
    (median and quartiles), tokens/s, and `first_call_s`, the first call (with any compilation)."""
    return measure_decoders(model, input_ids, attention_mask, [decoder], max_new_tokens, repeats,
                            warmup, **gen_kwargs)[0]


def measure_decoders(model, input_ids, attention_mask, decoders, max_new_tokens, repeats=10, warmup=1,
                     **gen_kwargs):
    """`measure` for several decoders, alternated: a list of rows, one per decoder."""
    calls = {d: decoder_call(model, input_ids, attention_mask, d, max_new_tokens, **gen_kwargs)
             for d in decoders}
    return measure_calls(model, input_ids, calls, max_new_tokens, repeats, warmup)[0]


def _row(model, input_ids, max_new_tokens, method, t_full, t_first, out, first_s, attention=None):
    B, T = input_ids.shape
    steps = out.shape[1] - T
    med, q1, q3 = spread(t_full)
    per_step = [(a - b) / (steps - 1) for a, b in zip(t_full, t_first)] if steps > 1 else [np.nan]
    step, step_q1, step_q3 = spread(per_step)
    c = conditions(model)
    if method not in COMPILED_STEP:  # the other methods run the model's own attention
        c["decode_attention"] = model.config._attn_implementation
    if attention:
        c["decode_attention"] = attention
    return {**c, "method": method, "batch": B, "prompt_len": T,
            "max_new_tokens": max_new_tokens, "new_tokens": steps,
            "median_s": med, "q1_s": q1, "q3_s": q3, "min_s": min(t_full), "max_s": max(t_full),
            "repeats": len(t_full), "ttft_ms": 1e3 * spread(t_first)[0],
            "ms_per_step": 1e3 * step, "ms_per_step_q1": 1e3 * step_q1,
            "ms_per_step_q3": 1e3 * step_q3, "tokens_per_s": B * steps / med, "first_call_s": first_s}


def fit_exponent(lengths, seconds):
    """Slope of log(time) against log(length): ~2 for a loop that re-runs the whole sequence, ~1 with a
    cache. Fit on the longer lengths, where fixed costs no longer dominate."""
    x, y = np.log(np.asarray(lengths, float)), np.log(np.asarray(seconds, float))
    return float(np.polyfit(x, y, 1)[0])


# --- the floor -------------------------------------------------------------------------------------------

def bytes_per_step(config, batch, context, dtype_bytes=4):
    """Bytes one decode step must move at least: every weight once (the tied embedding doubles as the
    lm_head, so it is read in full) plus the keys and values it attends over: 2 x layers x batch x
    context x hidden. `context` is the current length for a dynamic cache and the whole cache length for
    a static one (it attends over the unused positions too)."""
    h, layers, vocab = config.n_embd, config.n_layer, config.vocab_size
    per_layer = 12 * h * h + 13 * h  # attention (4h^2 + 4h) + MLP (8h^2 + 5h) + two layer norms (4h)
    params = layers * per_layer + vocab * h + config.n_positions * h + 2 * h
    kv = 2 * layers * batch * context * h
    return (params + kv) * dtype_bytes


def measure_bandwidth(nbytes=2**30, repeats=20):
    """Device memory bandwidth in bytes/s from a large device-to-device copy (bytes read + written)."""
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del src, dst
    torch.cuda.empty_cache()  # else the two buffers stay in the allocator and later requests split them
    return 2 * nbytes * repeats / seconds


def floor_ms(config, batch, context, dtype_bytes, bandwidth):
    """Milliseconds per step that memory bandwidth alone allows."""
    return 1e3 * bytes_per_step(config, batch, context, dtype_bytes) / bandwidth


# --- memory fragmentation --------------------------------------------------------------------------------

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


# --- GPU idle time from a profiler trace -----------------------------------------------------------------

def profile_decode(fn, path=None):
    """Profile `fn()` (CPU + CUDA activities) and return the GPU work that the decoder launched, as a
    DataFrame of intervals: name, stream, start_us, end_us (kernels, memcpys and memsets from the Kineto
    trace, kept only if launched inside `generate`'s "fastgen.<decoder>" range, so input checks and the
    caller's own work stay out). `path` keeps the Chrome trace (open it in Perfetto)."""
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
        return trace_intervals(json.load(f), annotation="fastgen.")


def kernel_ms_per_step(fn, steps):
    """GPU time per decode step: profile `fn()` and sum the time the GPU was busy with the decoder's
    work (kernels, copies; overlapping intervals merged), over `steps`. Beside the wall time per step,
    it says whether a loop is bound by the GPU's work or by the host that feeds it."""
    return gpu_gaps(profile_decode(fn))["busy_us"] / steps / 1e3


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
    out = {"span_us": span, "busy_us": busy, "idle_us": span - busy, "busy_fraction": busy / span if span else 1.0,
           "gaps_us": gaps, "largest_gap_us": max(gaps) if gaps else 0.0}
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
    of the decode loop's span that lies inside steps."""
    steps = step_spans(intervals, min_kernels)
    if len(steps) < 2:
        return {"steps": len(steps), "kernels_per_step": float(steps.kernels.median()) if len(steps) else 0}
    gaps = (steps.start_us.iloc[1:].to_numpy() - steps.end_us.iloc[:-1].to_numpy()).clip(min=0)
    span = steps.end_us.iloc[-1] - steps.start_us.iloc[0]
    return {"steps": len(steps), "kernels_per_step": float(steps.kernels.median()),
            "step_us_median": float((steps.end_us - steps.start_us).median()),
            "gap_between_steps_us_median": float(np.median(gaps)), "gap_between_steps_us_total": float(gaps.sum()),
            "in_steps_fraction": float(1 - gaps.sum() / span)}


def top_kernels(intervals, k=12):
    """Where GPU time goes: total microseconds, count and mean per kernel name, largest first."""
    d = intervals.assign(us=intervals.end_us - intervals.start_us)
    t = d.groupby("name").us.agg(["sum", "count", "mean"]).sort_values("sum", ascending=False)
    t["share"] = t["sum"] / t["sum"].sum()
    t.index = [n[:70] for n in t.index]
    return t.head(k)

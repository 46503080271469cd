"""How every chapter times: the conditions a number depends on, one timing protocol (alternated rounds,
the prefill apart from the decode steps, median and IQR), and the memory-bandwidth floor a decode step
cannot beat. Book: every chapter (the protocol and the floor: chapter 0; the floor again: chapter 4).
The allocator is `memory`'s job, profiler traces `traces`'s."""
import gc
import os
import platform
import time

import numpy as np
import torch
import transformers

from .decoders import attention_of, generate

BENCH_VERSION = 3  # bump when the timing method changes (2: alternated rounds, prefill apart, IQR;
#                   3: rounds where the host ran slow left out: `compare`'s pace_slack)


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
    return c


def sync(device=None):
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()  # host waits for the GPU here: a timer must not stop before the GPU does


# --- timing ---------------------------------------------------------------------------------------------

def time_call(fn, repeats=10, warmup=1):
    """Wall time of `fn()` in seconds: `warmup` untimed calls (compile, graph capture, lazy init), then
    `repeats` timed calls, each between two synchronizations, the garbage collector off.
    Returns (list of seconds, last result). To compare methods, use `compare`: it alternates them."""
    times, out, _ = compare({"fn": fn}, repeats, warmup)
    return times["fn"], out["fn"]


_BEST_PACE = [float("inf")]  # the host's best pace seen in this process (`host_pace`), seconds


def host_pace(n=20_000):
    """Seconds that a fixed piece of pure Python takes now (best of three): the host's pace.
    An eager decoder is host-bound and runs at this pace; a shared host can halve it for
    seconds. Keeps the best pace this process has seen: the reference for "full pace"."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        total = 0
        for i in range(n):
            total += i
        best = min(best, time.perf_counter() - t0)
    _BEST_PACE[0] = min(_BEST_PACE[0], best)
    return best


def compare(calls, repeats=10, warmup=1, pace_slack=1.3, max_rounds=None,
            progress=None):
    """The book's timing protocol. `calls` maps names to functions. Each is called
    `warmup` times (compile, capture, lazy init), then rounds run every call once, in
    turn (A B C A B C ...), so that a slow moment of the machine hits all methods alike.
    Each call is timed between two synchronizations, with the garbage collector off. The
    host's pace is taken before each round and after each call: a round where the host
    ran over `pace_slack` times slower than at its best in this process is left out, and
    rounds go on until `repeats` ran at full pace (at most `max_rounds`, default 2 x
    repeats; then the `repeats` best-paced). `pace_slack=None` keeps every round.
    Returns ({name: [seconds]}, {name: last result}, {"rounds": rounds run, "full_pace":
    whether `repeats` of them ran at full pace, "pace_ratio": the kept rounds' median
    pace over the best}). `progress(1)`, if given, is called after every call."""
    if pace_slack is not None and pace_slack < 1:
        raise ValueError(f"pace_slack={pace_slack}: a ratio to the best pace, "
                         ">= 1 (or None)")
    max_rounds = 2 * repeats if max_rounds is None else max_rounds
    if repeats < 1 or max_rounds < repeats:
        raise ValueError(f"repeats={repeats}, max_rounds={max_rounds}: "
                         "need 1 <= repeats <= max_rounds")
    out = {}
    for _ in range(warmup):
        for name, fn in calls.items():
            out[name] = fn()
            if progress:
                progress(1)
    sync()

    def full(rounds):  # the rounds where the host ran at full pace
        return [r for r in rounds
                if pace_slack is None or r[0] <= pace_slack * _BEST_PACE[0]]

    rounds = []  # (the host's slower pace around the round, {name: seconds})
    enabled = gc.isenabled()
    gc.collect()
    # a collection in a timed call would be charged to whichever method ran then
    gc.disable()
    try:
        while len(full(rounds)) < repeats and len(rounds) < max_rounds:
            pace = host_pace() if pace_slack else 0.0
            t = {}
            for name, fn in calls.items():
                t0 = time.perf_counter()
                out[name] = fn()
                # host waits for the GPU here: the timer stops when the GPU has finished
                sync()
                t[name] = time.perf_counter() - t0
                if progress:
                    progress(1)
                # after every call, not only the round: a host slow for seconds shows
                pace = max(pace, host_pace()) if pace_slack else 0.0
            rounds.append((pace, t))
    finally:
        if enabled:
            gc.enable()
    kept = full(rounds)
    # the host never came back to full pace: its best-paced rounds
    if len(kept) < repeats:
        kept = sorted(rounds, key=lambda r: r[0])[:repeats]
    ratio = (float(np.median([p for p, _ in kept])) / _BEST_PACE[0] if pace_slack
             else np.nan)
    stats = {"rounds": len(rounds), "full_pace": len(full(rounds)) >= repeats,
             "pace_ratio": ratio}
    return {name: [t[name] for _, t in kept] for name in calls}, out, stats


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
    call.decode_attention = attention_of(model, decoder, gen_kwargs.get("decode_attention", "auto"))
    return call


def measure_calls(model, input_ids, calls, max_new_tokens, repeats=10, warmup=1,
                  progress=None):
    """Time methods side by side. `calls` maps a method name to `call(n)`, which
    generates `n` new tokens. For each method, `call(max_new_tokens)` and `call(1)` are
    timed, all alternated (`compare`). `call(1)` is the time to first token (the prefill
    and one token choice); the decode time per step is the difference, over the other
    steps, taken round by round. `progress(1)` is called after every call. Returns
    (rows, {method: tokens})."""
    first_s = {}
    # the first call of each holds its compile: reported apart
    for m, c in calls.items():
        t0 = time.perf_counter()
        c()
        sync()
        first_s[m] = time.perf_counter() - t0
        if progress:
            progress(1)
    timed = {}
    for m, c in calls.items():
        timed[m] = c
        if max_new_tokens > 1:
            timed[f"{m}@1"] = lambda c=c: c(1)
    # on a CPU the calls run on the host itself: its pace is what is timed
    slack = 1.3 if input_ids.is_cuda else None
    times, outs, stats = compare(timed, repeats, warmup, slack, progress=progress)
    rows = [_row(model, input_ids, max_new_tokens, m, times[m],
                 times.get(f"{m}@1", times[m]), outs[m], first_s[m],
                 getattr(calls[m], "decode_attention", None)) | stats
            for m in calls]
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
    c["decode_attention"] = attention or attention_of(model, method)  # the call's, else the method's
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

def bytes_per_step(model, batch, context):
    """Bytes one decode step of `model` must move at least: every weight once, from the
    model's own parameter tensors (a tied embedding is one tensor: it doubles as the
    lm_head, so it is read in full, once), plus the keys and values it attends over: 2 x
    layers x batch x context x kv heads x head size, in the model's dtype. `context` is
    the current length for a dynamic cache and the whole cache length for a static one
    (it attends over the unused positions too)."""
    # each tensor once, tied or not
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # the generic names: GPT2Config maps them to n_layer, n_head, n_embd
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = (getattr(cfg, "head_dim", None)
                or cfg.hidden_size // cfg.num_attention_heads)
    kv = (2 * cfg.num_hidden_layers * batch * context * kv_heads * head_dim
          * model.dtype.itemsize)
    return weights + kv


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


def floor_ms(model, batch, context, bandwidth):
    """Milliseconds per step that memory bandwidth alone allows (`bytes_per_step` / `bandwidth`)."""
    return 1e3 * bytes_per_step(model, batch, context) / bandwidth

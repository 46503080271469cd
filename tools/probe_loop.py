"""The gpu_loop decoder on the GPU (issue 16, chapter 10), beside `fused` (the same step under the
interleaved driver) and `interleaved` (chapter 8's compiled step), GPT-2 124M, float32, prompt 16:

  python tools/probe_loop.py OUT [main [K]]  tokens (EOS biases that stop no row, or all); ms
      per step on an idle host and on a busy one (K CPU-bound processes, default 2, per core of
      this process's affinity); host API calls per call, from a profiler trace; and the stop's
      tail: a call that stops on EOS after k tokens against one asked for exactly k
  python tools/probe_loop.py OUT cpu      the host's CPU time per call and per decode step, in a
      process whose CUDA context and events block instead of spinning while the host waits (else
      a wait counts as work)

Every timing follows the book's protocol (alternated, 10 kept rounds, median and IQR; 30 rounds,
all kept, on the busy host). Pin the process first (taskset -c 8-11): the busy-host burners
share its cores."""
import collections
import functools
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

OUT, MODE = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "main")
PER_CORE = int(sys.argv[3]) if len(sys.argv) > 3 else 2  # the busy host's burners per core
if MODE == "cpu":  # before torch makes the context: block on waits (CU_CTX_SCHED_BLOCKING_SYNC)
    from cuda.bindings import driver
    driver.cuInit(0)
    _, dev = driver.cuDeviceGet(0)
    (err,) = driver.cuDevicePrimaryCtxSetFlags(dev, driver.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC)
    assert int(err) == 0, err

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

if MODE == "cpu":  # and the drivers' flag events block too (an event's own flag, not the context's)
    torch.cuda.Event = functools.partial(torch.cuda.Event, blocking=True)

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import measure, traces  # noqa: E402
from fastgen_lib.models import EOS  # noqa: E402

OUT.mkdir(parents=True, exist_ok=True)
N, T = 100, 16
METHODS = ("interleaved", "fused", "gpu_loop")
KW = dict(eos_token_id=EOS, pad_token_id=EOS)
model = fg.load_model("124m", device="cuda")
batches = {b: fg.make_batch(b, T, mixed=True, seed=b, device="cuda") for b in (1, 32)}


def calls(batch, methods=METHODS):
    ids, mask = batches[batch]
    return {m: measure.decoder_call(model, ids, mask, m, N, **KW) for m in methods}


def save(rows, name):
    pd.DataFrame(rows).to_csv(OUT / name, index=False)
    print(pd.DataFrame(rows).round(4).to_string(index=False), flush=True)


def host_cpu():
    """Host CPU time per decode step: thread time of call(N) minus call(1), over N - 1 steps."""
    cols = ["batch", "method", "host_cpu_us_per_step", "q1", "q3", "wall_ms_per_step",
            "host_cpu_ms_call_1", f"host_cpu_ms_call_{N}", "wall_ms_call_1",
            f"wall_ms_call_{N}"]
    # the check that waits block here: a long kernel, waited for three ways
    probe = []
    for how in ("stream", "event", "device"):
        torch.cuda.synchronize()
        c0, w0 = time.thread_time(), time.perf_counter()
        torch.cuda._sleep(500_000_000)  # about 0.25 s of one GPU thread
        if how == "stream":
            torch.cuda.current_stream().synchronize()
        elif how == "event":
            e = torch.cuda.Event()
            e.record()
            e.synchronize()
        else:
            torch.cuda.synchronize()
        probe.append({"wait": how, "wall_ms": 1e3 * (time.perf_counter() - w0),
                      "cpu_ms": 1e3 * (time.thread_time() - c0)})
    save(probe, "blocking_wait_check.csv")
    rows = []
    for batch in (1, 32):
        cs = calls(batch)
        for c in cs.values():
            c()
            c(1)
        t = collections.defaultdict(list)
        gc.collect()
        gc.disable()
        for _ in range(30):  # the eager prefill's CPU time varies by a millisecond
            for m, c in cs.items():
                for n in (N, 1):
                    c0, w0 = time.thread_time(), time.perf_counter()
                    c(n)
                    torch.cuda.synchronize()
                    t[m, n].append((time.thread_time() - c0, time.perf_counter() - w0))
        gc.enable()
        for m in cs:
            cpu = [(a[0] - b[0]) / (N - 1) * 1e6 for a, b in zip(t[m, N], t[m, 1])]
            wall = [(a[1] - b[1]) / (N - 1) * 1e3 for a, b in zip(t[m, N], t[m, 1])]
            med, q1, q3 = measure.spread(cpu)
            calls_ms = [1e3 * measure.spread([x[i] for x in t[m, n]])[0]
                        for i in (0, 1) for n in (1, N)]  # CPU, then wall, per call
            rows.append(dict(zip(cols, [batch, m, med, q1, q3, measure.spread(wall)[0],
                                        *calls_ms])))
    save(rows, "host_cpu.csv")


def api_calls(fn):
    """CUDA runtime and driver calls that `fn()` made on the host inside `generate`, by name."""
    events = traces.profile_trace(fn)["traceEvents"]
    (start, end), = [(e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") == "user_annotation" and e["name"].startswith("fastgen.")]
    return collections.Counter(e["name"] for e in events if e.get("ph") == "X"
                               and e.get("cat") in ("cuda_runtime", "cuda_driver")
                               and start <= e["ts"] <= end)


def time_methods(batch, every_round):
    """`measure.measure_calls`, 10 rounds. `every_round`: keep the rounds where the host ran
    slow too (compare's pace_slack=None), as it does on purpose under the busy host, and take
    30: a busy host's prefill and wake-ups vary by a few ms a call, which 10 paired rounds
    leave as +-10% in a batch-1 step's median."""
    compare = measure.compare
    if every_round:
        measure.compare = functools.partial(compare, pace_slack=None)
    try:
        return measure.measure_calls(model, batches[batch][0], calls(batch), N,
                                     repeats=30 if every_round else 10)
    finally:
        measure.compare = compare


def main():
    # 1. tokens: gpu_loop against fused, rows that never stop and rows that all stop early
    checks = []
    for batch, (ids, mask) in batches.items():
        for bias in (0.0, 2.0, 3.0):
            fg.set_eos_bias(model, bias)
            a = fg.generate(model, ids, mask, decoder="fused", max_new_tokens=N, **KW)
            b = fg.generate(model, ids, mask, decoder="gpu_loop", max_new_tokens=N, **KW)
            checks.append({"batch": batch, "eos_bias": bias, "new_tokens_fused": a.shape[1] - T,
                           "new_tokens_gpu_loop": b.shape[1] - T, "equal": torch.equal(a, b)})
    fg.set_eos_bias(model, 0.0)
    save(checks, "tokens.csv")
    # 2. ms per step on an idle host, then with burners on this process's cores
    rows = []
    cores = sorted(os.sched_getaffinity(0))
    for host in ("idle", "busy"):
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(PER_CORE * len(cores) if host == "busy" else 0)]
        try:
            time.sleep(1.0 if burners else 0.0)
            for batch in (1, 32):
                r, _ = time_methods(batch, every_round=bool(burners))
                rows += [x | {"host": host, "burners": len(burners), "cores": len(cores)}
                         for x in r]
        finally:
            for p in burners:
                p.kill()
    cols = ["host", "batch", "method", "ms_per_step", "ms_per_step_q1", "ms_per_step_q3",
            "ttft_ms", "median_s"]
    pd.DataFrame(rows).to_csv(OUT / "timing.csv", index=False)
    print(pd.DataFrame(rows)[cols].round(4).to_string(index=False), flush=True)
    # 3. the stop's tail: stop on EOS after k tokens, against exactly k asked for (no stop needed)
    rows = []
    for batch, bias in ((1, 3.0), (32, 3.0)):
        fg.set_eos_bias(model, bias)
        cs = calls(batch)
        k = cs["fused"]().shape[1] - T
        timed = {f"{m}@stop": c for m, c in cs.items()}
        timed |= {f"{m}@{k}": (lambda c=c: c(k)) for m, c in cs.items()}
        times, outs, _ = measure.compare(timed, repeats=30)
        for m in cs:
            d = [1e3 * (a - b) for a, b in zip(times[f"{m}@stop"], times[f"{m}@{k}"])]
            med, q1, q3 = measure.spread(d)
            rows.append({"batch": batch, "eos_bias": bias, "new_tokens": k, "method": m,
                         "stop_ms": 1e3 * measure.spread(times[f"{m}@stop"])[0],
                         "exact_ms": 1e3 * measure.spread(times[f"{m}@{k}"])[0],
                         "tail_ms": med, "tail_q1": q1, "tail_q3": q3,
                         "same_tokens": torch.equal(outs[f"{m}@stop"], outs[f"{m}@{k}"])})
    fg.set_eos_bias(model, 0.0)
    save(rows, "tail.csv")
    tails = rows
    # 4. host API calls per call, N new tokens and 1 (the prefill and its token), no row
    # stopping; last, as a profiler session can change how later host-bound loops time
    rows = []
    for batch in (1, 32):
        for m, c in calls(batch).items():
            c(), c(1)
            for n in (N, 1):
                for name, k in api_calls(lambda: c(n)).items():
                    rows.append({"batch": batch, "method": m, "new_tokens": n, "api": name,
                                 "calls": k})
    # and the steps launched past the stop: graph launches of a call that stops on EOS after k
    # tokens, against one asked for exactly k (the tail's calls)
    for r in tails:
        fg.set_eos_bias(model, r["eos_bias"])
        c = calls(r["batch"], [r["method"]])[r["method"]]
        c(), c(r["new_tokens"])
        for n, label in ((N, "stop"), (r["new_tokens"], "exact")):
            k = api_calls(lambda: c(n))["cudaGraphLaunch"]
            rows.append({"batch": r["batch"], "method": r["method"], "new_tokens": n,
                         "api": "cudaGraphLaunch", "calls": k, "eos_bias": r["eos_bias"],
                         "call": label})
    fg.set_eos_bias(model, 0.0)
    save(rows, "api_calls.csv")


host_cpu() if MODE == "cpu" else main()

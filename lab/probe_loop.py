"""The gpu_loop decoder on the GPU (issue 16, chapter 10), beside `fused` (the same step under the
interleaved driver) and `interleaved` (chapter 8's compiled step), GPT-2 124M, float32, prompt 16:

  PYTHONPATH=. python lab/probe_loop.py OUT [main [K]]  tokens (EOS biases that stop no row, or
      all); ms per step on an idle host and on a busy one (K CPU-bound processes, default 2, per
      core of this process's affinity); host API calls per call, from a profiler trace; and the
      stop's tail: a call that stops on EOS after k tokens against one asked for exactly k

Every timing follows the book's protocol (alternated, 10 kept rounds, median and IQR; 30 rounds,
all kept, on the busy host). Pin the process first (taskset -c 8-11): the busy-host burners
share its cores. The CPU probe (`host_cpu.csv`: the host's CPU time per step in a process whose
waits block) patched torch.cuda.Event, so it is not here: `git show bad43bd:tools/probe_loop.py`."""
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import measure, traces
from fastgen_lib.models import EOS

N, T = 100, 16
METHODS = ("interleaved", "fused", "gpu_loop")
KW = dict(eos_token_id=EOS, pad_token_id=EOS)


def calls(batch, methods=METHODS):
    ids, mask = batches[batch]
    return {m: measure.decoder_call(model, ids, mask, m, N, **KW) for m in methods}


def save(rows, name):
    pd.DataFrame(rows).to_csv(OUT / name, index=False)
    print(pd.DataFrame(rows).round(4).to_string(index=False), flush=True)


def api_calls(fn):
    """CUDA runtime and driver calls that `fn()` made on the host inside `generate`, by name."""
    events = traces.profile_trace(fn)["traceEvents"]
    (start, end), = [(e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") == "user_annotation" and e["name"].startswith("fastgen.")]
    return collections.Counter(e["name"] for e in events if e.get("ph") == "X"
                               and e.get("cat") in ("cuda_runtime", "cuda_driver")
                               and start <= e["ts"] <= end)


def timed_rows(model, input_ids, calls, max_new_tokens, repeats=10, pace_slack=1.3):
    """`measure.measure_calls`' rows, with `compare`'s `pace_slack`: None keeps every round, as
    the busy host needs (its rounds all run slow)."""
    first_s = {}
    for m, c in calls.items():  # the first call of each holds its compile: reported apart
        t0 = time.perf_counter()
        c()
        measure.sync()
        first_s[m] = time.perf_counter() - t0
    timed = {k: v for m, c in calls.items() for k, v in ((m, c), (f"{m}@1", lambda c=c: c(1)))}
    times, outs, stats = measure.compare(timed, repeats, pace_slack=pace_slack)
    B, T = input_ids.shape
    rows = []
    for m, c in calls.items():
        full, first, steps = times[m], times[f"{m}@1"], outs[m].shape[1] - T
        med, q1, q3 = measure.spread(full)
        step = measure.spread([(a - b) / (steps - 1) for a, b in zip(full, first)])
        rows.append(measure.conditions(model) | {
            "decode_attention": getattr(c, "decode_attention", None), "method": m, "batch": B,
            "prompt_len": T, "max_new_tokens": max_new_tokens, "new_tokens": steps,
            "median_s": med, "q1_s": q1, "q3_s": q3, "min_s": min(full), "max_s": max(full),
            "repeats": len(full), "ttft_ms": 1e3 * measure.spread(first)[0],
            "ms_per_step": 1e3 * step[0], "ms_per_step_q1": 1e3 * step[1],
            "ms_per_step_q3": 1e3 * step[2], "tokens_per_s": B * steps / med,
            "first_call_s": first_s[m]} | stats)
    return rows


def time_methods(batch, every_round):
    """10 rounds; `every_round`: keep the rounds where the host ran slow too, as it does on
    purpose under the busy host, and take 30: a busy host's prefill and wake-ups vary by a few
    ms a call, which 10 paired rounds leave as +-10% in a batch-1 step's median."""
    return timed_rows(model, batches[batch][0], calls(batch), N, repeats=30 if every_round else 10,
                      pace_slack=None if every_round else 1.3)


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
                r = time_methods(batch, every_round=bool(burners))
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


if __name__ == "__main__":
    if sys.argv[2:3] not in ([], ["main"]):
        sys.exit("usage: probe_loop.py OUT [main [K]] (the CPU probe: "
                 "git show bad43bd:tools/probe_loop.py)")
    OUT = Path(sys.argv[1])
    PER_CORE = int(sys.argv[3]) if len(sys.argv) > 3 else 2  # the busy host's burners per core
    OUT.mkdir(parents=True, exist_ok=True)
    model = fg.load_model("124m", device="cuda")
    batches = {b: fg.make_batch(b, T, mixed=True, seed=b, device="cuda") for b in (1, 32)}
    main()

"""The host's pace beside a canonical run, so that a chapter timed on a slow host is seen.

`measure.compare` judges each round against the best pace seen *in its own process*, which misses a
process that runs slow from its first round (results/h200/pace/noisy_host/: a chapter timed `naive`
at twice its usual step with `full_pace True`). This monitor samples `measure.host_pace` every few
seconds in a process of its own, on a core the chapters do not use; `scripts/gpu.sh book` starts it
and, after the chapters, summarises it per chapter against an absolute limit.

    python3 scripts/pace_monitor.py run PACE_CSV [--every 5]          # until killed (SIGTERM)
    python3 scripts/pace_monitor.py summary PACE_CSV CHAPTERS_CSV [--max-ms 0.65]
    python3 scripts/pace_monitor.py gate [--max-ms 0.65] [--samples 10]   # before a device call's
        # timing: exits 3 if the host's median pace is over --max-ms now (a slow host stays slow
        # for minutes: results/h200/fused/generate_slow_host/), so the call can do something else

CHAPTERS_CSV has columns chapter, start_s, end_s (Unix seconds). The summary prints each chapter's
median and largest pace, and exits 1 if a chapter's median pace is over --max-ms: 0.65 ms is 1.15 x
the 0.57 ms of the H200 host that made the canonical run (results/h200/pace/)."""
import argparse
import signal
import sys
import time

import pandas as pd

from fastgen_lib import measure


def run(path, every):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(path, "w") as f:
        f.write("t_s,pace_ms\n")
        while not stop:
            f.write(f"{time.time():.3f},{1e3 * measure.host_pace():.4f}\n")
            f.flush()
            deadline = time.time() + every
            while not stop and time.time() < deadline:
                time.sleep(0.1)


def summary(pace, chapters, max_ms):
    """Per chapter: samples taken while it ran, their median and largest pace (ms), and
    `slow`: whether the median is over max_ms (a chapter with no sample is slow: unknown)."""
    rows = []
    for ch in chapters.itertuples():
        p = pace.pace_ms[(pace.t_s >= ch.start_s) & (pace.t_s <= ch.end_s)]
        med = float(p.median()) if len(p) else float("nan")
        rows.append({"chapter": ch.chapter, "samples": len(p), "median_ms": med,
                     "max_ms": float(p.max()) if len(p) else float("nan"),
                     "slow": not med <= max_ms})
    return pd.DataFrame(rows)


def gate(samples, every):
    """The host's pace `samples` times, `every` seconds apart: (paces in ms, their median)."""
    paces = []
    for i in range(samples):
        paces.append(1e3 * measure.host_pace())
        if i < samples - 1:
            time.sleep(every)
    return paces, float(pd.Series(paces).median())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("pace_csv")
    r.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    s = sub.add_parser("summary")
    s.add_argument("pace_csv")
    s.add_argument("chapters_csv")
    s.add_argument("--max-ms", type=float, default=0.65, help="largest median pace, ms")
    g = sub.add_parser("gate")
    g.add_argument("--max-ms", type=float, default=0.65, help="largest median pace, ms")
    g.add_argument("--samples", type=int, default=10)
    g.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    args = ap.parse_args()
    if args.cmd == "gate":
        if args.samples < 1 or args.every < 0:
            ap.error("--samples must be >= 1 and --every >= 0")
        paces, med = gate(args.samples, args.every)
        print("pace ms:", " ".join(f"{p:.3f}" for p in paces), f"(median {med:.3f})")
        if med > args.max_ms:
            print(f"HOST SLOW (median pace over {args.max_ms} ms): do not time now")
            return 3
        print(f"host at pace (median under {args.max_ms} ms)")
        return 0
    if args.cmd == "run":
        if args.every <= 0:
            ap.error("--every must be > 0")
        return run(args.pace_csv, args.every)
    table = summary(pd.read_csv(args.pace_csv), pd.read_csv(args.chapters_csv), args.max_ms)
    print(table.round(3).to_string(index=False))
    slow = table[table.slow]
    if len(slow):
        print(f"HOST SLOW (median pace over {args.max_ms} ms) during: "
              f"{', '.join(slow.chapter)}: do not commit these chapters' timings")
        return 1
    print(f"host at pace (median under {args.max_ms} ms) in every chapter")
    return 0


if __name__ == "__main__":
    sys.exit(main())

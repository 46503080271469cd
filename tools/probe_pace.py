"""Does an eager decoder's call time follow the host's pace? `measure.compare` leaves out rounds where
`measure.host_pace` (a fixed piece of pure Python) ran slow; this probe checks that the two move
together. In one process, for `--seconds` per phase: host_pace, then one kv_cache call (batch 1, 20
new tokens: host-bound), again and again; the phases pin the process to all cores, to 4 and to 1
(twice over). Per phase: the CPU time the kernel counted as stolen by the hypervisor (/proc/stat).
Writes OUT/pace.csv, OUT/pace.png and prints a summary. Usage:
    python tools/probe_pace.py OUT [--seconds 6]"""
import argparse
import gc
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import measure, plots  # noqa: E402


def cpu_times():
    """user nice system idle iowait irq softirq steal, from /proc/stat (jiffies)."""
    return np.array(open("/proc/stat").readline().split()[1:9], float)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = fg.load_model()
    ids, mask = fg.make_batch(1, 16, seed=1, device=model.device)

    def call():
        fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=20)
        measure.sync()

    for _ in range(3):
        call()
    cpus = sorted(os.sched_getaffinity(0))
    phases = [("all cores", set(cpus)), ("4 cores", set(cpus[-4:])), ("1 core", {cpus[-1]})] * 2
    rows, t0 = [], time.perf_counter()
    gc.disable()
    for k, (name, pin) in enumerate(phases):
        os.sched_setaffinity(0, pin)
        before, start = cpu_times(), time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            pace = measure.host_pace()
            t = time.perf_counter()
            call()
            rows.append({"t_s": t - t0, "phase": k, "pinning": name, "pace_ms": 1e3 * pace,
                         "call_ms": 1e3 * (time.perf_counter() - t)})
        d = cpu_times() - before
        for r in rows:
            if r["phase"] == k:
                r["steal_share"] = d[7] / d.sum()
    gc.enable()
    os.sched_setaffinity(0, set(cpus))
    df = pd.DataFrame(rows)
    df["full_pace"] = df.pace_ms <= 1.2 * df.pace_ms.min()  # compare's default pace_slack
    df.to_csv(out / "pace.csv", index=False)

    summary = df.groupby(["phase", "pinning"]).agg(
        calls=("call_ms", "size"), call_ms=("call_ms", "median"),
        call_ms_p90=("call_ms", lambda s: s.quantile(0.9)), pace_ms=("pace_ms", "median"),
        slow_share=("full_pace", lambda s: 1 - s.mean()), steal_share=("steal_share", "first"))
    print(summary.round(3).to_string())
    r = np.corrcoef(df.pace_ms, df.call_ms)[0, 1]
    kept, slow = df[df.full_pace].call_ms, df[~df.full_pace].call_ms
    print(f"pace vs call time: r = {r:.2f}; call ms median at full pace {kept.median():.2f}, "
          f"in slow pace {slow.median() if len(slow) else float('nan'):.2f} "
          f"({len(slow)} of {len(df)} calls)")

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    for ok, c, label in ((True, "tab:blue", "host at full pace"), (False, "tab:red", "host slow")):
        g = df[df.full_pace == ok]
        ax_t.plot(g.t_s, g.call_ms, ".", color=c, ms=3, label=label)
        ax_s.plot(g.pace_ms, g.call_ms, ".", color=c, ms=3)
    ax_t.set(xlabel="seconds into the probe", ylabel="ms per kv_cache call (20 tokens)",
             title="Call time over time")
    ax_t.legend(fontsize=8)
    ax_s.set(xlabel="host_pace, ms", ylabel="ms per call", title=f"Against the pace (r = {r:.2f})")
    plots.footer(fig, measure.conditions(model), "batch 1, prompt 16, eager kv_cache")
    fig.savefig(out / "pace.png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()

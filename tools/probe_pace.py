"""Does an eager decoder's call time follow the host's pace? `measure.compare` leaves out rounds
where `measure.host_pace` (a fixed piece of pure Python) ran slow; this probe checks that the two
move together, and that a CUDA-graph decoder (the control) does not. In one process, again and
again: the pace, on CUDA the launch pace (200 launches of a tiny kernel: the launch path, which
pure Python does not see), one eager kv_cache call and one compiled call (batch 1, 20 new tokens),
the pace again; beside them what the kernel counted: CPU time stolen by the hypervisor (/proc/stat), this
thread's wait in the run queue (/proc/self/schedstat) and involuntary context switches. Phases pin
the process to all cores, to 4 and to 1, twice over. Writes OUT/pace.csv, OUT/pace.png and prints
a summary; "recall" is the share of slow eager calls (over 1.3 x the median) that the pace flagged.
Usage: python tools/probe_pace.py OUT [--seconds 15]   (seconds per phase, 6 phases)"""
import argparse
import gc
import os
import resource
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import measure, plots  # noqa: E402

SLACK = 1.3  # compare's default pace_slack


def steal_ms():
    """CPU time the hypervisor took from this VM, all CPUs (ms, from /proc/stat)."""
    return float(open("/proc/stat").readline().split()[8]) * 1e3 / os.sysconf("SC_CLK_TCK")


def run_delay_ms():
    """This thread's time waiting in the run queue (ms, /proc/self/schedstat; 0 where absent)."""
    try:
        return float(open("/proc/self/schedstat").read().split()[1]) / 1e6
    except OSError:
        return 0.0


def launch_pace(n=200):
    """Seconds that n launches of a tiny CUDA kernel take on the host (best of three), the
    GPU drained before each try: the launch path's pace, which pure Python does not see."""
    x = torch.zeros(1, device="cuda")
    best = float("inf")
    for _ in range(3):
        measure.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        best = min(best, time.perf_counter() - t0)
    measure.sync()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = fg.load_model()
    ids, mask = fg.make_batch(1, 16, seed=1, device=model.device)

    def call(decoder):
        fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=20)
        measure.sync()

    for _ in range(3):  # compile and capture the control, warm the eager one
        call("kv_cache"), call("compiled")
    cuda = torch.cuda.is_available()
    cpus = sorted(os.sched_getaffinity(0))
    phases = [("all cores", set(cpus)), ("4 cores", set(cpus[-4:])), ("1 core", {cpus[-1]})] * 2
    rows, t0 = [], time.perf_counter()
    gc.disable()
    for k, (name, pin) in enumerate(phases):
        os.sched_setaffinity(0, pin)
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            s0, d0 = steal_ms(), run_delay_ms()
            c0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            pace = measure.host_pace()
            launch = launch_pace() if cuda else float("nan")
            t = time.perf_counter()
            call("kv_cache")
            t1 = time.perf_counter()
            call("compiled")
            t2 = time.perf_counter()
            pace = max(pace, measure.host_pace())
            rows.append({"t_s": t - t0, "phase": k, "pinning": name, "pace_ms": 1e3 * pace,
                         "launch_us": 1e6 * launch / 200,
                         "eager_ms": 1e3 * (t1 - t), "graph_ms": 1e3 * (t2 - t1),
                         "steal_ms": steal_ms() - s0, "run_delay_ms": run_delay_ms() - d0,
                         "nivcsw": resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - c0})
    gc.enable()
    os.sched_setaffinity(0, set(cpus))
    df = pd.DataFrame(rows)
    df["flagged"] = df.pace_ms > SLACK * 1e3 * measure._BEST_PACE[0]
    df["slow"] = df.eager_ms > SLACK * df.eager_ms.median()
    df.to_csv(out / "pace.csv", index=False)

    summary = df.groupby(["phase", "pinning"]).agg(
        calls=("eager_ms", "size"), eager_ms=("eager_ms", "median"),
        eager_p90=("eager_ms", lambda s: s.quantile(0.9)), graph_ms=("graph_ms", "median"),
        pace_ms=("pace_ms", "median"), launch_us=("launch_us", "median"), flagged=("flagged", "mean"), slow=("slow", "mean"),
        steal_ms=("steal_ms", "sum"), run_delay_ms=("run_delay_ms", "sum"))
    print(summary.round(3).to_string())
    r = {c: np.corrcoef(df.pace_ms, df[c])[0, 1] for c in ("eager_ms", "graph_ms")}
    if cuda:
        print(f"r(launch, eager) = {np.corrcoef(df.launch_us, df.eager_ms)[0, 1]:.2f}; "
              f"eager ms per launch us (median ratio) "
              f"{(df.eager_ms / df.launch_us).median():.1f}")
    slow = df[df.slow]
    print(f"calls {len(df)}, slow eager calls {len(slow)}; recall (slow and flagged) "
          f"{slow.flagged.mean() if len(slow) else float('nan'):.2f}; flagged but not slow "
          f"{(df.flagged & ~df.slow).mean():.3f}; r(pace, eager) = {r['eager_ms']:.2f}, "
          f"r(pace, graph) = {r['graph_ms']:.2f}; slow calls' median steal "
          f"{slow.steal_ms.median() if len(slow) else float('nan'):.2f} ms, run delay "
          f"{slow.run_delay_ms.median() if len(slow) else float('nan'):.2f} ms")

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    for flagged, c, label in ((False, "tab:blue", "host at full pace"),
                              (True, "tab:red", f"host over {SLACK}x its best")):
        g = df[df.flagged == flagged]
        ax_t.plot(g.t_s, g.eager_ms, ".", color=c, ms=3, label=f"kv_cache, {label}")
        ax_s.plot(g.pace_ms, g.eager_ms, ".", color=c, ms=3)
    ax_t.plot(df.t_s, df.graph_ms, ".", color="0.5", ms=2, label="compiled (the control)")
    ax_t.set(xlabel="seconds into the probe", ylabel="ms per call (20 tokens)",
             title="Call time over time")
    ax_t.legend(fontsize=7)
    ax_s.set(xlabel="host_pace, ms", ylabel="kv_cache, ms per call",
             title=f"Against the pace (r = {r['eager_ms']:.2f})")
    plots.footer(fig, measure.conditions(model), "batch 1, prompt 16, 20 new tokens")
    fig.savefig(out / "pace.png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()

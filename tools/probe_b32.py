"""Why does `compiled` at batch 32 in float32 take about 1.22 ms a step in one process and about
1.46-1.50 in another, with tight quartiles in both (book appendix, "Chapter 8's run of 21:11")?

One guess to test: inductor benchmarks a generated kernel's candidate configs the first time it runs
and keeps the fastest for the process (and, through its on-disk cache, for later processes). With
`dynamic=True` the batch-32 step is compiled at the first batch > 1 it meets, so a choice made on a
noisy benchmark would stick. This probe runs `PROCESSES` fresh processes in turn, each with a cache
directory of its own (`TORCHINDUCTOR_CACHE_DIR`), in the ladder's order (batch 1, then batch 32),
and writes per process the decode ms per step at batch 32, its kernel time per step (one profiled
call) and the config each kernel kept (the cache's `*.best_config` files):

    python tools/probe_b32.py OUT [PROCESSES] [SIZE] [TOKENS]   # 4, 124m (or tiny), 100 new tokens

OUT/processes.csv: process, device, ms_per_step (median, q1, q3), kernel_ms_per_step, host pace.
OUT/configs.csv: process, kernel (file name), config (JSON). On a CPU inductor writes C++, no
configs: the CPU run checks only that the probe runs."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import pandas as pd


def child(out, label, size, tokens):
    import torch

    import fastgen_lib as fg
    from fastgen_lib import measure, traces

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = fg.load_model(size, device=device, weights="random")
    row = {"process": label, "device": device}
    for batch in (1, 32):  # the ladder's order: the batch > 1 compile comes second
        ids, mask = fg.make_batch(batch, 16, seed=batch, device=device)
        r = measure.measure(model, ids, mask, "compiled", int(tokens), repeats=10)
        row[f"b{batch}_ms_per_step"] = r["ms_per_step"]
        row[f"b{batch}_q1"], row[f"b{batch}_q3"] = r["ms_per_step_q1"], r["ms_per_step_q3"]
    if device == "cuda":  # the last batch's kernel time, one profiled call after the timing
        row["b32_kernel_ms_per_step"] = traces.kernel_ms_per_step(
            lambda: fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=int(tokens)),
            int(tokens) - 1)
    row["host_pace_ms"] = 1e3 * measure.host_pace()
    with open(os.path.join(out, f"process_{label}.json"), "w") as f:
        json.dump(row, f)


def main(out, processes=4, size="124m", tokens=100):
    os.makedirs(out, exist_ok=True)
    rows, configs = [], []
    for i in range(processes):
        with tempfile.TemporaryDirectory(prefix=f"inductor_{i}_") as cache:  # read, then removed
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            subprocess.run([sys.executable, __file__, "child", out, str(i), size, str(tokens)],
                           env=env, check=True)
            for path in sorted(glob.glob(os.path.join(cache, "**", "*.best_config"),
                                         recursive=True)):
                with open(path) as f:
                    configs.append({"process": i, "kernel": os.path.basename(path),
                                    "config": json.dumps(json.load(f), sort_keys=True)})
        with open(os.path.join(out, f"process_{i}.json")) as f:
            rows.append(json.load(f))
        print(pd.DataFrame(rows[-1:]).round(3).to_string(index=False), flush=True)
    pd.DataFrame(rows).to_csv(os.path.join(out, "processes.csv"), index=False)
    cfg = pd.DataFrame(configs, columns=["process", "kernel", "config"])
    cfg.to_csv(os.path.join(out, "configs.csv"), index=False)
    if len(cfg):  # the kernels whose kept config differs between processes
        differ = cfg.groupby("kernel").config.nunique()
        print(f"{len(differ)} kernels with a kept config; {int((differ > 1).sum())} differ "
              "between processes")


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(*sys.argv[2:6])
    else:
        args = sys.argv[1:] + [None] * 3
        main(args[0], int(args[1] or 4), args[2] or "124m", int(args[3] or 100))

"""Issue 14, batch 1: the fused step's kernels stream their weights at 0.9-1.15 TB/s in
bfloat16, each phase too short to fill the memory pipeline before the next sync point. Here each
kernel also brings a later kernel's weights into L2 (`fused_forward(prefetch=d)`: the d-th kernel
after it, `prefetch.global.L2`, before its PDL wait), so that kernel reads them from L2.
`FusedStep` as it is (`library`) against d = 1 and 2 (`ahead1`, `ahead2`), under the interleaved
driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16, batch 1: ms per step
(`measure.measure_calls`, alternated, 10 rounds), tokens against model.generate's.
The prefetch is not in the library: apply `results/h200/fused/prefetch/prefetch.patch` first
(`patch -p1 < ...`, from the repo root; it adds `prefetch=` to `gemv`, `attention_proj` and
`fused_forward`, and two CPU tests).
Usage: python tools/probe_prefetch.py OUT_DIR"""
import inspect
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps


def ahead(d):
    """FusedStep with `prefetch=d`."""
    return type(f"ahead{d}", (fused.FusedStep,), {"prefetch": d})


def main(out):
    if "prefetch" not in inspect.signature(fused.fused_forward).parameters:
        sys.exit("apply results/h200/fused/prefetch/prefetch.patch first (patch -p1 < ...)")
    out.mkdir(parents=True, exist_ok=True)
    steps = {"library": fused.FusedStep} | {f"ahead{d}": ahead(d) for d in (1, 2)}
    compare_steps(steps, (torch.bfloat16, torch.float32), (1,), "step",
                  same_as="library").to_csv(out / "step_prefetch.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

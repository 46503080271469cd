"""Issue 14: the fused step's kernels as programmatic dependent launches (PDL). Each GEMV reads its
first weight tile, then waits (griddepcontrol.wait) for the kernel ahead to finish; every kernel
lets the next one launch as soon as its own wait is over. Does that take the ~4 µs of fixed cost
per kernel off the step, and are the tokens unchanged? `FusedStep` with pdl on and off, under
the interleaved driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16, batch 1 and 32:
ms per step (`measure.measure_calls`: a 100-token call minus a 1-token call, alternated,
10 rounds), tokens against each other and against model.generate.
Usage: python tools/probe_pdl.py OUT_DIR"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
assert fused.supports_pdl(torch.device("cuda")), "PDL needs compute capability 9.0 or later"


class NoPDL(fused.FusedStep):
    pdl = False


steps = {"pdl": fused.FusedStep, "no_pdl": NoPDL}
compare_steps(steps, (torch.float32, torch.bfloat16), (1, 32), "launch", same_as="no_pdl").to_csv(
    out / "step_pdl.csv", index=False)

"""Issue 14: the fused step's kernels as programmatic dependent launches (PDL). Each GEMV reads its
first weight tile, then waits (griddepcontrol.wait) for the kernel ahead to finish; every kernel
lets the next one launch as soon as its own wait is over. Does that take the ~4 µs of fixed cost
per kernel off the step, and are the tokens unchanged? `FusedStep` with pdl on and off, under
the interleaved driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16, batch 1 and 32:
ms per step (`measure.compare`, alternated, 10 rounds: a 100-token call minus a 1-token call,
over 99 steps), tokens against each other and against model.generate.
Usage: python tools/probe_pdl.py OUT_DIR"""
import pathlib
import sys

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import fused, measure, stops
from fastgen_lib.decoders import decode
from fastgen_lib.models import EOS
from fastgen_lib.reference import first_divergence, hf_generate
from fastgen_lib.steps import GenConfig

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
assert fused.supports_pdl(torch.device("cuda")), "PDL needs compute capability 9.0 or later"


class NoPDL(fused.FusedStep):
    pdl = False


N, rows = 100, []
for dtype in (torch.float32, torch.bfloat16):
    model = fg.load_model("124m", device="cuda", dtype=dtype)
    for batch in (1, 32):
        ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
        ref = hf_generate(model, ids, mask, N, EOS, EOS)

        def call(step, n):
            gen = GenConfig(n, (EOS,), EOS, max_cache_len=16 + N)
            return lambda: decode(model, ids, mask, gen, step, stops.interleaved)

        steps = {"pdl": fused.FusedStep, "no_pdl": NoPDL}
        calls = {f"{k}@{n}": call(s, n) for k, s in steps.items() for n in (N, 1)}
        times, outs, _ = measure.compare(calls, repeats=10)
        for k in steps:
            per_step = [(a - b) / (N - 1) * 1e3
                        for a, b in zip(times[f"{k}@{N}"], times[f"{k}@1"])]
            med, q1, q3 = measure.spread(per_step)
            o = outs[f"{k}@{N}"]
            d = first_divergence(model, ids, mask, ref, o)
            rows.append({"dtype": str(dtype).split(".")[-1], "batch": batch, "launch": k,
                         "ms_per_step": med, "q1": q1, "q3": q3,
                         "tokens_equal_no_pdl": torch.equal(o, outs[f"no_pdl@{N}"]),
                         "tokens_equal_model_generate": torch.equal(o, ref),
                         "divergence": d})
            print(rows[-1], flush=True)
    del model
    torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(out / "step_pdl.csv", index=False)

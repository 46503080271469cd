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

        def call(step):
            def c(n=N):
                gen = GenConfig(n, (EOS,), EOS, max_cache_len=16 + N)
                return decode(model, ids, mask, gen, step, stops.interleaved)
            return c

        timed, outs = measure.measure_calls(
            model, ids, {"pdl": call(fused.FusedStep), "no_pdl": call(NoPDL)}, N, repeats=10)
        for r in timed:
            o = outs[r["method"]]
            d = first_divergence(model, ids, mask, ref, o)
            rows.append({"dtype": str(dtype).split(".")[-1], "batch": batch, "launch": r["method"],
                         "ms_per_step": r["ms_per_step"], "q1": r["ms_per_step_q1"],
                         "q3": r["ms_per_step_q3"],
                         "tokens_equal_no_pdl": torch.equal(o, outs["no_pdl"]),
                         "tokens_equal_model_generate": torch.equal(o, ref),
                         "divergence": d})
            print(rows[-1], flush=True)
    del model
    torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(out / "step_pdl.csv", index=False)

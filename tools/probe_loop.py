"""The gpu_loop decoder on the GPU (issue 16): its tokens against `fused` (the same step under the
interleaved driver) at batch 1 and 32, with EOS biases that stop no row, some rows, or all; then
both timed by the book's protocol (alternated, 10 kept rounds).
Usage: python tools/probe_loop.py OUT_DIR"""
import sys
from pathlib import Path

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import measure
from fastgen_lib.models import EOS

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
model = fg.load_model("124m", device="cuda")
N, checks, rows = 100, [], []
for batch in (1, 32):
    ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
    for bias in (0.0, 2.0, 3.0):
        fg.set_eos_bias(model, bias)
        kw = dict(max_new_tokens=N, eos_token_id=EOS, pad_token_id=EOS)
        a = fg.generate(model, ids, mask, decoder="fused", **kw)
        b = fg.generate(model, ids, mask, decoder="gpu_loop", **kw)
        checks.append({"batch": batch, "eos_bias": bias, "new_tokens_fused": a.shape[1] - 16,
                       "new_tokens_gpu_loop": b.shape[1] - 16, "equal": torch.equal(a, b)})
        print(checks[-1], flush=True)
    fg.set_eos_bias(model, 0.0)
    calls = {m: measure.decoder_call(model, ids, mask, m, N, eos_token_id=EOS, pad_token_id=EOS)
             for m in ("fused", "gpu_loop")}
    r, _ = measure.measure_calls(model, ids, calls, N, repeats=10)
    rows += r
    print(pd.DataFrame(r)[["method", "batch", "ms_per_step", "ms_per_step_q1", "ms_per_step_q3",
                           "ttft_ms"]].to_string(index=False), flush=True)
pd.DataFrame(checks).to_csv(out / "tokens.csv", index=False)
pd.DataFrame(rows).to_csv(out / "timing.csv", index=False)

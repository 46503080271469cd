"""Issue 14: at batch 32 in float32, the fused step's lm_head takes ~350 µs (cuBLAS: 84), because
its tl.dot multiplies float32 with input_precision="ieee" (no tensor cores). Does "tf32x3" (three
TF32 tensor-core products per float32 product: about float32's accuracy) give the speed, and the
same tokens? (The library has since adopted tf32x3.) fused.py is loaded twice, with float32's
dot precision set to each:
  1. the lm_head GEMV alone (x [B, 768] @ wte.T, B = 8, 16, 32), each precision and column tile,
     timed as tools/tune_fused.py does (20 calls in a CUDA graph on 20 copies of the weight), with
     its largest error against float64 and how many rows' argmax differ from float64's;
  2. the whole fused step under the interleaved driver, batch 32, 100 tokens: tokens against
     model.generate, and ms per step (`measure.measure_calls`, alternated, 10 rounds).
Usage: python tools/probe_precision.py OUT_DIR"""
import importlib.util
import pathlib
import sys
import tempfile

import pandas as pd
import torch
import triton

import fastgen_lib as fg
from fastgen_lib import fused, measure, stops
from fastgen_lib.decoders import decode
from fastgen_lib.models import EOS
from fastgen_lib.reference import first_divergence, hf_generate
from fastgen_lib.steps import GenConfig

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)


def variant(precision):
    """fastgen_lib.fused with its tl.dot's input_precision set to `precision`."""
    src = pathlib.Path(fused.__file__).read_text()
    assert src.count('PRECISION="tf32x3" if') == 1  # float32's choice in `gemv`
    path = pathlib.Path(tempfile.mkdtemp()) / f"fused_{precision}.py"
    path.write_text(src.replace('PRECISION="tf32x3" if', f'PRECISION="{precision}" if'))
    spec = importlib.util.spec_from_file_location(f"fastgen_lib.fused_{precision}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODS = {p: variant(p) for p in ("ieee", "tf32x3")}
model = fg.load_model("124m", device="cuda")
wte = model.transformer.wte.weight.detach()  # [V, K]: the lm_head reads it transposed
V, K = wte.shape
copies = [wte.clone() for _ in range(20)]
bias = torch.zeros(V, device="cuda")
rows = []
for B in (8, 16, 32):
    x = torch.randn(B, K, device="cuda")
    exact = x.double() @ wte.double().t()
    for (p, mod), block_n in [(m, bn) for m in MODS.items() for bn in (64, 128)]:
        y = mod.gemv(x, wte.t(), bias, block_n=block_n)
        err = (y.double() - exact).abs().max().item()
        argmax_diff = int((y.argmax(-1) != exact.argmax(-1)).sum())
        y.zero_()
        scratch = (torch.empty(mod.scratch_size(B, K, V, x.device, block_n=block_n),
                               device="cuda"), torch.zeros(mod.LOCKS, dtype=torch.int32,
                                                           device="cuda"))
        mod.gemv(x, copies[0].t(), bias, block_n=block_n, out=y, scratch=scratch)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for w in copies:
                mod.gemv(x, w.t(), bias, block_n=block_n, out=y, scratch=scratch)
        us = triton.testing.do_bench(g.replay, warmup=5, rep=20) * 1e3 / len(copies)
        rows.append({"batch": B, "precision": p, "block_n": block_n, "us": us,
                     "max_abs_err_vs_f64": err, "argmax_rows_differ": argmax_diff})
        print(rows[-1], flush=True)
    x = torch.randn(B, K, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in copies:
            torch.mm(x, w.t())
    us = triton.testing.do_bench(g.replay, warmup=5, rep=20) * 1e3 / len(copies)
    rows.append({"batch": B, "precision": "cublas", "us": us})
    print(rows[-1], flush=True)
del copies
torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(out / "lm_head_precision.csv", index=False)

# 2. the whole step, batch 32
ids, mask = fg.make_batch(32, 16, mixed=True, seed=32, device="cuda")
N, steps_rows = 100, []
ref = hf_generate(model, ids, mask, N, EOS, EOS)


def call(mod):
    def c(n=N):
        gen = GenConfig(n, (EOS,), EOS, max_cache_len=16 + N)
        return decode(model, ids, mask, gen, mod.FusedStep, stops.interleaved)
    return c


timed, outs = measure.measure_calls(model, ids, {p: call(mod) for p, mod in MODS.items()}, N,
                                    repeats=10)
for r in timed:
    o = outs[r["method"]]
    steps_rows.append({"precision": r["method"], "batch": 32, "ms_per_step": r["ms_per_step"],
                       "q1": r["ms_per_step_q1"], "q3": r["ms_per_step_q3"],
                       "tokens_equal_model_generate": torch.equal(o, ref),
                       "divergence": first_divergence(model, ids, mask, ref, o)})
    print(steps_rows[-1], flush=True)
pd.DataFrame(steps_rows).to_csv(out / "step_precision.csv", index=False)

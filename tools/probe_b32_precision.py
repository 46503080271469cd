"""Issue 14, batch 32 in float32: what do the three TF32 products of each `tl.dot` cost the step?
At batch > 1 `fused.gemv` multiplies float32 as `input_precision="tf32x3"` (about float32's
accuracy, three tensor-core products a dot). Two bounds, each `fused._gemv_kernel` with its dot
line replaced (`probe_b32_ln.variant_kernel`): `bound_head_tf32`, the lm_head (the GEMV with
ARGMAX) in one TF32 product, and `bound_all_tf32`, every GEMV so. One TF32 product keeps 10 bits
of each input's mantissa, so the logits move by up to about 1e-3 of their scale and a near-tie may
pick another token: these are bounds on what a cheaper lm_head (say, one TF32 product with an
exact check of the few columns near each row's maximum) could save, not steps to ship. Two
candidates to ship, every GEMV's float32 dot from bfloat16 pieces: `all_bf16x3` (three products,
about 16 bits of mantissa) and `all_bf16x6` (six, about float32's 24).
The step at batch 32 under the interleaved driver (prompt 16 mixed, 100 new tokens), the variants
alternated over 10 rounds, against `model.generate` and the library's tokens
(`step_ab.compare_steps`; a divergence comes with its top-2 logit gap).
Usage: python tools/probe_b32_precision.py OUT_DIR"""
import pathlib
import sys
import tempfile

import torch

from fastgen_lib import fused
from probe_b32_ln import swap, variant_kernel
from step_ab import compare_steps, patched_step

DOT = "acc = tl.dot(x, w, acc, input_precision=PRECISION)"
VARIANTS = {
    "library": [],
    "bound_head_tf32": [(DOT, 'acc = tl.dot(x, w, acc, input_precision="tf32" if ARGMAX '
                              'else PRECISION)')],
    "bound_all_tf32": [(DOT, 'acc = tl.dot(x, w, acc, input_precision="tf32" if PRECISION '
                             '== "tf32x3" else PRECISION)')],
    # float32 as bfloat16 pieces (Triton 3.6 on NVIDIA): x = hi + mid (+ lo), each bfloat16.
    # bf16x3: hi*hi + hi*mid + mid*hi, about 16 bits of mantissa; bf16x6 adds the three
    # products with lo (and mid*mid), about float32's 24. bfloat16 products run at twice TF32's
    # rate, so bf16x3 costs about one and a half TF32 products, bf16x6 about three
    "all_bf16x3": [(DOT, 'acc = tl.dot(x, w, acc, input_precision="bf16x3" if PRECISION '
                         '== "tf32x3" else PRECISION)')],
    "all_bf16x6": [(DOT, 'acc = tl.dot(x, w, acc, input_precision="bf16x6" if PRECISION '
                         '== "tf32x3" else PRECISION)')],
}


def steps(tmp):
    """{name: step class}, each variant's kernel compiled from a module under `tmp`."""
    out = {}
    for name, edits in VARIANTS.items():
        if not edits:
            out[name] = fused.FusedStep
            continue
        kernel = variant_kernel(edits, tmp)
        out[name] = patched_step(fused.FusedStep, lambda k=kernel: swap(k), name)
    return out


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = compare_steps(steps(tmp), (torch.float32,), (32,), "variant", same_as="library")
    d.to_csv(out / "step_b32_precision.csv", index=False)
    print(d.drop(columns="divergence").to_string())
    print(d[["variant", "divergence"]].to_string())


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

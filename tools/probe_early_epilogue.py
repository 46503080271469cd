"""Issue 14: what a fused kernel reads after its PDL wait. After `gdc_wait` a GEMV reads x (the
kernel ahead wrote it), sums, and then reads what its epilogue adds: the bias (or the folded
LayerNorm's d), the fold's c and the cache column for the K and V writes; in a loop of one
tile, LayerNorm's weight g too. No kernel ahead in the step writes those, but the wait orders
them after it: unless the compiler issues them with x's read, each GEMV waits for a second
trip to memory after the wait, 49 times a step at batch 1. Since the tenth version of `fused`
the library reads them before the wait. At batch 1 the attention and out-projection kernel
(`attention_proj`) also has a tail after its wait: the last of the H programs of a column tile
adds the H partial sums, one trip to memory each in a loop; the library now unrolls that loop
(H constexpr: all the reads at once) and reads the bias before the wait.

Variants, each the library's kernels with a few source lines replaced (`VARIANTS`), compiled
from a temporary module and put in the library's place while a step is built and captured:
`late_gemv`, the GEMV's epilogue reads after the wait (the ninth version's GEMV);
`late_attention_proj`, that kernel's loop and bias read as in the ninth version;
`ninth`, both; `early_residual`, the library with the GEMV's residual read before the wait too
(in the step h was written two or three kernels ahead; `gemv` alone promises no such thing).
The step at batch 1 and 32, float32 and bfloat16, under the interleaved driver (prompt 16
mixed, 100 new tokens), the variants alternated over 10 rounds, against `model.generate` and
the library's tokens (`step_ab.compare_steps`).
Usage: python tools/probe_early_epilogue.py OUT_DIR [batch ...] (1 32 by default)"""
import inspect
import pathlib
import sys
import tempfile
import textwrap

import torch

from fastgen_lib import fused
from step_ab import compare_steps, kernel_variant, patched_step, swap_kernels

WAIT = "    if PDL:  # x depends on the kernel ahead: wait for it to finish\n"


def _early_block():
    """The library GEMV's lines that read the epilogue's inputs before the wait."""
    src = textwrap.dedent(inspect.getsource(fused._gemv_kernel.fn))
    start = src.index("    # and what the epilogue adds")
    return src[start:src.index(WAIT)]


EARLY = _early_block()
LATE_GEMV = [  # the ninth version's GEMV: the epilogue's reads after the wait
    (EARLY, ""),
    ("            if ONE_TILE:\n                g = g1\n            else:\n"
     "                g = tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)\n",
     "            g = tl.load(g_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)\n"),
    ("            acc = rstd[:, None] * (acc - mean[:, None] * c[None, :])\n",
     "            c = tl.load(c_ptr + cols, mask=col_ok, other=0.0)\n"
     "            acc = rstd[:, None] * (acc - mean[:, None] * c[None, :])\n"),
    ("acc += bias[None, :]",
     "acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]"),
    ("cache += col * stride_cs", "cache += tl.load(col_ptr) * stride_cs"),
]
EARLY_RESIDUAL = [  # the residual too (h: written two or three kernels ahead in the step)
    (WAIT, """    if RESIDUAL:
        r1 = tl.load(r_ptr + rows[:, None] * stride_rb + cols[None, :],
                     mask=row_ok[:, None] & col_ok[None, :], other=0.0)
""" + WAIT),
    ("r = tl.load(r_ptr + rows[:, None] * stride_rb + cols[None, :], mask=out_ok, other=0.0)",
     "r = r1"),
]
LATE_ATTENTION_PROJ = [  # the ninth version's: a loop of H reads, the bias after the wait
    ("part_ptr, lock_ptr, B, H: tl.constexpr, D, N, scale,",
     "part_ptr, lock_ptr, B, H, D, N, scale,"),
    ("    bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)\n", ""),
    ("        for i in tl.static_range(H):  # fixed order, whoever came last; unrolled: the H\n"
     "            y += tl.load(part + i * B * N, mask=col_ok, other=0.0,  # reads at once\n"
     "                         cache_modifier=\".cg\")\n",
     "        for i in range(H):  # fixed order, whoever came last\n"
     "            y += tl.load(part + i * B * N, mask=col_ok, other=0.0, "
     "cache_modifier=\".cg\")\n"),
    ("        y += bias\n",
     "        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)\n"),
]
GEMV, PROJ = "_gemv_kernel", "_attention_proj_kernel"
VARIANTS = {  # name: {kernel: edits}
    "library": {},
    "late_gemv": {GEMV: LATE_GEMV},
    "late_attention_proj": {PROJ: LATE_ATTENTION_PROJ},
    "ninth": {GEMV: LATE_GEMV, PROJ: LATE_ATTENTION_PROJ},
    "early_residual": {GEMV: EARLY_RESIDUAL},
}


def variant_kernels(variant, tmp):
    """{kernel name: kernel} of `variant` (a name of VARIANTS)."""
    return {k: kernel_variant(k, e, tmp) for k, e in VARIANTS[variant].items()}


def steps(tmp):
    """{name: step class} for every variant, its kernels compiled from modules under `tmp`."""
    return {name: fused.FusedStep if not edits else
            patched_step(fused.FusedStep, lambda k=variant_kernels(name, tmp): swap_kernels(k),
                         name)
            for name, edits in VARIANTS.items()}


def main(out, batches):
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = compare_steps(steps(tmp), (torch.float32, torch.bfloat16), batches, "variant",
                          same_as="library")
    d.to_csv(out / "step_early_epilogue.csv", index=False)
    print(d.drop(columns="divergence").to_string())
    print(d[["dtype", "batch", "variant", "divergence"]].to_string())


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), [int(b) for b in sys.argv[2:]] or [1, 32])

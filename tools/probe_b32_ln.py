"""Issue 14, batch 32: what in the folded LayerNorm and the cache write costs `c_attn` and
`c_fc` their time? Alone at batch 32 (results/h200/fused/b32_epilogue/, float32), `c_attn`
takes 9.98 µs plain, 15.20 with LayerNorm folded in, 20.26 with the K and V cache write too.
Each variant here is `fused._gemv_kernel` with a few source lines replaced (`VARIANTS`),
compiled from a temporary module and put in the library's place: first while the GEMV runs
alone as the step calls it (`probe_b32_epilogue.layer_call`, with PDL), 20 calls in one CUDA
graph. Then the whole step at batch 32, alternated, against `model.generate`: the library's,
where the GEMV that writes h also sums it for the next LayerNorm (`gemv(..., stats_out=)`),
against `sums_in_loop`, where each LayerNorm'd GEMV sums x in its own loop (as it does alone
here, and as the library did before).
Variants whose name starts with `bound_` skip work the result needs: they say what that work
costs, and their output is wrong. The others compute the library's result.
Usage: python tools/probe_b32_ln.py OUT_DIR [alone] [step] (both by default)"""
import pathlib
import sys
import tempfile

import pandas as pd
import torch

from fastgen_lib import fused
from probe_b32_epilogue import layer_call
from step_ab import kernel_variant, kernels_in_place, swap_kernels

STATS_1D = [  # LayerNorm's sums per row, reduced across K within each tile: [BLOCK_M], not
    # [BLOCK_M, BLOCK_K] carried through the loop (a program has 1 or 2 tiles at batch 32)
    ("s1 = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)", "s1 = tl.zeros([BLOCK_M], "
     "dtype=tl.float32)"),
    ("s2 = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)", "s2 = tl.zeros([BLOCK_M], "
     "dtype=tl.float32)"),
    ("s1 += xf\n", "s1 += tl.sum(xf, axis=1)\n"),
    ("s2 += xf * xf\n", "s2 += tl.sum(xf * xf, axis=1)\n"),
    ("sum1 = tl.sum(s1, axis=1)", "sum1 = s1"),
    ("sum2 = tl.sum(s2, axis=1)", "sum2 = s2"),
]
QKV_CHEAP = [  # q, k or v by two comparisons, not a division by E; the head size D constexpr
    ("part_ix = cols // E", "part_ix = (cols >= E).to(tl.int32) + (cols >= 2 * E).to(tl.int32)"),
    ("j = cols % E", "j = cols - part_ix * E"),
    ("B, K, N, eps, D,", "B, K, N, eps, D: tl.constexpr,"),
]
VARIANTS = {
    "library": [],
    "stats_1d": STATS_1D,
    "qkv_cheap": QKV_CHEAP,
    "stats_1d+qkv_cheap": STATS_1D + QKV_CHEAP,
    "bound_no_stats": [("if STATS_IN == 0:  # (else", "if STATS_IN < 0:  # (else")],
    "bound_no_g": [("x = (xf * g[None, :]).to(w_ptr.dtype.element_ty)",
                    "x = xf.to(w_ptr.dtype.element_ty)")],
    "bound_no_split_stats": [  # the split's LayerNorm sums neither stored nor added up
        ("        if LN and STATS_IN == 0:\n            tl.store(stat", "        if LN and "
         "SPLIT < 0:\n            tl.store(stat"),
        ("                if LN and STATS_IN == 0:\n                    sum1 +=",
         "                if LN and SPLIT < 0:\n                    sum1 +="),
    ],
    "bound_no_cache_write": [  # (and no cache addresses: unused, they are not computed)
        ("tl.store(k_ptr + cache, out, mask=out_ok & (part_ix == 1)[None, :])", "pass"),
        ("tl.store(v_ptr + cache, out, mask=out_ok & (part_ix == 2)[None, :])", "pass")],
}
CASES = {"c_attn": ("ln", "qkv"), "c_fc": ("ln", "gelu")}  # the GEMVs with LayerNorm folded in


def variant_kernel(edits, tmp):
    """`fused._gemv_kernel` with each (old, new) of `edits` replaced in its source (each `old`
    exactly once), as a new triton.jit function loaded from a module written under `tmp`."""
    return kernel_variant("_gemv_kernel", edits, tmp)


def kernel_in_place(kernel):
    """`fused.gemv` launches `kernel` inside the block."""
    return kernels_in_place({"_gemv_kernel": kernel})


def alone(out):
    """Each variant kernel in the library's place, each LayerNorm'd GEMV alone (`CASES`)."""
    from step_ab import bench_graph
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {v: variant_kernel(e, tmp) for v, e in VARIANTS.items()}
        for dtype in (torch.float32, torch.bfloat16):
            for rnd in range(2):  # the variants alternated, twice
                for name, features in CASES.items():
                    for v, kernel in kernels.items():
                        if "qkv" in v and "qkv" not in features:
                            continue
                        with kernel_in_place(kernel):
                            us = bench_graph(layer_call(name, features + ("pdl",), dtype))
                        rows.append({"dtype": str(dtype)[6:], "name": name, "variant": v,
                                     "round": rnd, "us": us})
                        print(rows[-1], flush=True)
                pd.DataFrame(rows).to_csv(out / "b32_ln.csv", index=False)
    d = pd.DataFrame(rows)
    print(d.pivot_table(index=["name", "variant"], columns="dtype", values="us",
                        aggfunc="median", sort=False).round(2).to_string())


def step(out):
    """The step at batch 32: the library's against `sums_in_loop`."""
    from step_ab import compare_steps, patched_step
    steps = {"library": fused.FusedStep,
             "sums_in_loop": patched_step(fused.FusedStep, sums_in_loop, "sums_in_loop")}
    d = compare_steps(steps, (torch.float32, torch.bfloat16), (32,), "variant",
                      same_as="library")
    d.to_csv(out / "step_b32_ln.csv", index=False)
    print(d.drop(columns="divergence").to_string())


def sums_in_loop():
    """`patched_step`'s patch: Buffers without `stats`, so that each GEMV with LayerNorm sums x
    in its own loop; and the function that puts Buffers back."""
    init = fused.Buffers.__init__

    def without_stats(self, *args):
        init(self, *args)
        self.stats = None
    fused.Buffers.__init__ = without_stats

    def undo():
        fused.Buffers.__init__ = init
    return undo


def swap(kernel):
    """`patched_step`'s patch: `kernel` in the library's place, and the function that undoes it."""
    return swap_kernels({"_gemv_kernel": kernel})


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for part in sys.argv[2:] or ("alone", "step"):
        {"alone": alone, "step": step}[part](out)

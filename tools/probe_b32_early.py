"""Issue 14, batch 32: the layer GEMVs' weights read before the PDL wait. At batch 1 each
program reads its one tile of W before `gdc_wait`, so the weights stream in while the kernel
ahead finishes. At batch > 1 the library's GEMV reads W inside tl.dot's loop, after the wait:
its first tile, loaded before the wait, is left unused (`fused._gemv_kernel`). Here the kernel
(`EARLY`, a two-line edit) uses that tile when a program's chunk of K is one tile (K_CHUNK ==
BLOCK_K), and the layer GEMVs at batch > 1 get tiles with one tile a chunk (`one_tile`:
block_n columns, block_k rows, K in K / block_k chunks). Each variant changes only how the
same products are grouped; the lm_head keeps its own tiles.
The step at batch 32, float32 and bfloat16, under the interleaved driver (prompt 16 mixed, 100
new tokens), the variants alternated over 10 rounds, against `model.generate` and the
library's tokens (`step_ab.compare_steps`).
Usage: python tools/probe_b32_early.py OUT_DIR [dtype ...] (float32 bfloat16 by default)"""
import contextlib
import pathlib
import sys
import tempfile

import torch
import triton

from fastgen_lib import fused
from probe_b32_ln import kernel_in_place, swap, variant_kernel  # noqa: F401
from step_ab import compare_steps, patched_step

EARLY = [  # a chunk of K that is one tile: its tile, read before the wait, is the one summed
    ("if BLOCK_M == 1:  # the next tile is read while this one is summed",
     "if BLOCK_M == 1 or K_CHUNK == BLOCK_K:  # the next tile is read while this one is summed"),
    ("            if not ONE_TILE:\n                w_next",
     "            if K_CHUNK != BLOCK_K:\n                w_next"),
]
# name: (kernel edits, layer tiles at batch > 1 as (block_n, block_k, num_warps) or None: gemv's)
VARIANTS = {
    "library": ([], None),
    "early": (EARLY, None),  # float32's tiles have two tiles a chunk: unchanged there
    "k64": ([], (64, 64, 4)),
    "early_k64": (EARLY, (64, 64, 4)),
    "early_k128": (EARLY, (64, 128, 4)),
    "early_n32_k128": (EARLY, (32, 128, 4)),
    "early_n32_k64": (EARLY, (32, 64, 4)),
}


def one_tile(block_n, block_k, num_warps):
    """A `layer_tiles` whose batch > 1 tiles split K into chunks of one block_k tile each."""
    library = fused.layer_tiles

    def tiles(B, K, N, dtype):
        if B == 1:
            return library(B, K, N, dtype)
        bk = min(block_k, triton.next_power_of_2(K))
        return dict(block_n=block_n, block_k=bk, split=triton.cdiv(K, bk), num_warps=num_warps)
    return tiles


def patch(kernel, tiles):
    """`patched_step`'s patch: `kernel` (None: the library's) and `tiles` in the library's
    place, and the function that puts them back."""
    def apply():
        undo_kernel = swap(kernel) if kernel is not None else (lambda: None)
        saved = fused.layer_tiles
        if tiles is not None:
            fused.layer_tiles = one_tile(*tiles)

        def undo():
            fused.layer_tiles = saved
            undo_kernel()
        return undo
    return apply


@contextlib.contextmanager
def steps(tmp):
    """{name: step class} for every variant, its kernel compiled from a module under `tmp`."""
    out = {}
    for name, (edits, tiles) in VARIANTS.items():
        kernel = variant_kernel(edits, tmp) if edits else None
        out[name] = (fused.FusedStep if kernel is None and tiles is None
                     else patched_step(fused.FusedStep, patch(kernel, tiles), name))
    yield out


def main(out, dtypes):
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, steps(tmp) as classes:
        d = compare_steps(classes, dtypes, (32,), "variant", same_as="library")
    d.to_csv(out / "step_b32_early.csv", index=False)
    print(d.drop(columns="divergence").to_string())
    print(d[["dtype", "variant", "divergence"]].to_string())


if __name__ == "__main__":
    names = sys.argv[2:] or ["float32", "bfloat16"]
    main(pathlib.Path(sys.argv[1]), [getattr(torch, n) for n in names])

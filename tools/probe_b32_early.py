"""Issue 14, batch 32: the layer GEMVs' weights read before the PDL wait. At batch 1 each
program reads its one tile of W before `gdc_wait`, so the weights stream in while the kernel
ahead finishes. Since results/h200/fused/b32_early/ the library does so at any batch: where a
program's chunk of K is one tile (`ONE_TILE`), `tl.dot` sums the tile read before the wait, and
float32 at batch > 1 has 128-row tiles, four programs per SM, so that each chunk of GPT-2's layer
GEMVs is one tile (`fused.default_tiles`). Here the library's step against `late` (the tile read
again after the wait, in tl.dot's loop: `LATE`, a one-line edit of the kernel) and `before` (that,
with float32's earlier tiles at batch > 1: 32 rows, two or three a chunk), the step before the
change. (That directory's CSV came from this probe before the library adopted the change, at
commit 9729eb4, where the variants were edits of the kernel of that time.)
The step at batch 32, float32 and bfloat16, under the interleaved driver (prompt 16 mixed, 100
new tokens), the variants alternated over 10 rounds, against `model.generate` and the
library's tokens (`step_ab.compare_steps`).
Usage: python tools/probe_b32_early.py OUT_DIR [dtype ...] (float32 bfloat16 by default)"""
import contextlib
import pathlib
import sys
import tempfile

import torch

from fastgen_lib import fused
from probe_b32_ln import kernel_in_place, swap, variant_kernel  # noqa: F401
from step_ab import compare_steps, patched_step

LATE = [  # every tile of W read in tl.dot's loop, after the wait (the one read before unused)
    ("if BLOCK_M == 1 or ONE_TILE:  # the next tile is read while this one is summed",
     "if BLOCK_M == 1:  # the next tile is read while this one is summed"),
]


def tiles_before(B, dtype):
    """`fused.default_tiles` before the change: float32 at batch > 1, 32-row tiles."""
    return (32, 4) if B > 1 and dtype == torch.float32 else (128, 2)


# name: (kernel edits, default_tiles or None: the library's)
VARIANTS = {"library": ([], None), "late": (LATE, None), "before": (LATE, tiles_before)}


def patch(kernel, tiles):
    """`patched_step`'s patch: `kernel` and `tiles` (None: the library's) in the library's
    place, and the function that puts them back."""
    def apply():
        undo_kernel = swap(kernel) if kernel is not None else (lambda: None)
        saved = fused.default_tiles
        if tiles is not None:
            fused.default_tiles = tiles

        def undo():
            fused.default_tiles = saved
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

"""Issue 14: the fused step's time per step with other GEMV tiles. With PDL a GEMV reads its first
weight tile before it waits for the kernel ahead; the rest of its chunk of K comes after the wait,
on the step's critical path. With block_k = 128 a chunk is one tile at GPT-2's shapes (fewer,
longer programs). `FusedStep` with `gemv`'s defaults (`fused.default_tiles`) against steps whose
GEMVs use other (block_k, programs_per_sm), under the interleaved driver, prompt 16 mixed,
100 new tokens: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens against
model.generate.
Usage: python tools/probe_gemv_tiles.py OUT_DIR [BLOCK_K:PROGRAMS_PER_SM ...] (default: TILES)"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps, with_attr

TILES = [(128, 4), (128, 8), (32, 4)]  # (block_k, programs_per_sm), each beside the default


def with_tiles(block_k, programs_per_sm, step=fused.FusedStep):
    """`step` with these GEMV tiles (in place of `fused.default_tiles`) while it builds its
    buffers and captures its graphs."""
    return with_attr(step, f"k{block_k}_p{programs_per_sm}", fused, "default_tiles",
                     lambda B, dtype: (block_k, programs_per_sm))


def main(out, tiles=TILES):
    out.mkdir(parents=True, exist_ok=True)
    steps = {"default": fused.FusedStep} | {s.__name__: s for s in (with_tiles(*t) for t in tiles)}
    df = compare_steps(steps, (torch.float32, torch.bfloat16), (1, 32), "tiles", same_as="default")
    name = "_".join(f"k{k}_p{p}" for k, p in tiles) if tiles != TILES else "gemv_tiles"
    df.to_csv(out / f"step_{name}.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]),
         [tuple(map(int, t.split(":"))) for t in sys.argv[2:]] or TILES)

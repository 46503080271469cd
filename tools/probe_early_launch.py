"""Issue 14: how early the next kernel starts. Under PDL each fused kernel lets the kernel after
it launch once its own wait is over (`gdc_launch_dependents()` after `gdc_wait()`), so a kernel's
reads before its wait (its weights, the cache's older slots) overlap only the kernel ahead's work
after that kernel's wait. With `fused.EARLY_LAUNCH` every kernel lets the next one launch first
thing: the next kernel's programs take their places and read their weights while this kernel
still waits, several kernels ahead as far as the SMs hold them. Waits are unchanged (each kernel
still waits for the one ahead to finish), so the tokens must not change.

At batch 32 in float32 a GEMV reads nothing before its wait (tl.dot's loop reads after it); two
more steps there: `chunk_early`, each GEMV's K cut into chunks of one 64-row tile, each read
before the wait (`gemv(early_w=True)`), and the same with EARLY_LAUNCH (`chunk_early_launch`).

`FusedStep` under the interleaved driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16,
batch 1 and 32: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens against
model.generate and the library's step.
Usage: python tools/probe_early_launch.py OUT_DIR"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps, with_attr


LAYER_TILES = fused.layer_tiles  # the library's, kept: the steps patch fused.layer_tiles


def chunk_tiles(batch, K, N, dtype):
    """layer_tiles with, at batch > 1, K in chunks of one 64-row tile read before the wait."""
    if batch == 1:
        return LAYER_TILES(batch, K, N, dtype)
    return dict(block_n=64, block_k=64, split=K // 64, early_w=True)


def steps():
    early = with_attr(fused.FusedStep, "early_launch", fused, "EARLY_LAUNCH", True)
    chunk = with_attr(fused.FusedStep, "chunk_early", fused, "layer_tiles", chunk_tiles)
    both = with_attr(chunk, "chunk_early_launch", fused, "EARLY_LAUNCH", True)
    return {"default": fused.FusedStep, "early_launch": early, "chunk_early": chunk,
            "chunk_early_launch": both}


def main(out, batches=(1, 32)):
    out.mkdir(parents=True, exist_ok=True)
    df = compare_steps(steps(), (torch.float32, torch.bfloat16), batches, "step",
                       same_as="default")
    df.to_csv(out / "step_early_launch.csv", index=False)
    return df


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

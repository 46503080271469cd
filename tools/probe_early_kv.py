"""Issue 14: the attention kernel reading the cache's older slots before it waits. Under PDL each
attention waits for the QKV GEMV ahead of it, then reads the keys and values of every used slot.
Only column `col` is the GEMV's; earlier steps wrote the rest, so `attention(early_kv=True)` reads
them before the wait. With the GEMV tiles of tools/probe_gemv_tiles.py as well: `FusedStep` as it
is, with early_kv, with block_k 128 (two programs per SM) and 32 (four), each with and without
early_kv, under the interleaved driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16,
batch 1 and 32: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens.
Usage: python tools/probe_early_kv.py OUT_DIR [b1]   (b1: only the default, k128_p2 and
k128_p2_early_kv, at batch 1: step_early_kv_b1.csv)"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from probe_gemv_tiles import with_tiles
from step_ab import compare_steps, patched_step


def with_early_kv(step):
    """`step` (a FusedStep class) with `attention(early_kv=True)` while it captures its graphs."""
    def patch():
        saved = fused.attention.__defaults__
        fused.attention.__defaults__ = saved[:-1] + (True,)

        def undo():
            fused.attention.__defaults__ = saved
        return undo

    return patched_step(step, patch, f"{step.__name__}_early_kv")


def main(out, b1=False):
    out.mkdir(parents=True, exist_ok=True)
    assert fused.attention.__defaults__[-1] is False  # early_kv, the last argument
    base = {"default": fused.FusedStep, "k128_p2": with_tiles(128, 2), "k32_p4": with_tiles(32, 4)}
    steps = {}
    for name, step in base.items():
        steps[name] = step
        steps[f"{name}_early_kv"] = with_early_kv(step)
    if b1:
        steps = {n: steps[n] for n in ("default", "k128_p2", "k128_p2_early_kv")}
    compare_steps(steps, (torch.float32, torch.bfloat16), (1,) if b1 else (1, 32), "step",
                  same_as="default").to_csv(out / f"step_early_kv{'_b1' if b1 else ''}.csv",
                                            index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:] == ["b1"])

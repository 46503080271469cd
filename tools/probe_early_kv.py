"""Issue 14: what the fused step reads before its PDL waits. Each GEMV reads its first weight tile
before it waits for the kernel ahead (with `fused.default_tiles`, 128 rows of K at batch 1: most
chunks are that one tile); the attention reads the cache's older slots before it waits
(`attention(early_kv=True)`): only column `col` is the QKV GEMV's, earlier steps wrote the rest.
`FusedStep` as it is (`default`), with the attention waiting first (`late_kv`), and with the GEMV
tiles chapter 9 first had, block_k 64 and four programs per SM (`k64_p4`, `k64_p4_late_kv`),
under the interleaved driver, prompt 16 mixed, 100 new tokens, float32 and bfloat16, batch 1 and
32: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens. At batch 1 every step runs
the attention as its own kernel, then c_proj (`probe_attention_proj.separate`), where the library
joins them (`fused.attention_proj`, which always reads early): what this probe compares.
Usage: python tools/probe_early_kv.py OUT_DIR [b1]   (b1: batch 1 only: step_early_kv_b1.csv)"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from probe_attention_proj import separate, with_attention_proj
from probe_gemv_tiles import with_tiles
from step_ab import compare_steps, patched_step


def with_early_kv(step, early_kv):
    """`step` (a FusedStep class) with `attention(early_kv=early_kv)` while it captures its
    graphs."""
    def patch():
        saved = fused.attention
        fused.attention = lambda *args, **kw: saved(*args, **(kw | {"early_kv": early_kv}))

        def undo():
            fused.attention = saved
        return undo

    return patched_step(step, patch, f"{step.__name__}_{'early' if early_kv else 'late'}_kv")


def main(out, b1=False):
    out.mkdir(parents=True, exist_ok=True)
    k64_p4 = with_tiles(64, 4)
    steps = {"default": fused.FusedStep, "late_kv": with_early_kv(fused.FusedStep, False),
             "k64_p4": k64_p4, "k64_p4_late_kv": with_early_kv(k64_p4, False)}
    steps = {name: with_attention_proj(name, separate, step) for name, step in steps.items()}
    compare_steps(steps, (torch.float32, torch.bfloat16), (1,) if b1 else (1, 32), "step",
                  same_as="default").to_csv(out / f"step_early_kv{'_b1' if b1 else ''}.csv",
                                            index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:] == ["b1"])

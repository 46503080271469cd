"""Issue 14: at batch 1, each GEMV of the fused step reading its whole K as one tile, before its PDL
wait, against a split of K (gemv's default tiles; the library's at batch 1 before
`fused.layer_tiles`, which came from this probe). A split GEMV leaves partial sums, counts itself
in with an atomic, and the last program of a column tile reads the partials back and adds them: two
more round trips through L2 after the wait, ~1.5 us of the 2.5-2.7 us a kernel hands off in
(results/h200/fused/chain/). A GEMV whose programs each read all of K (fewer columns each) has none
of that: wait, read x, sum, write. Its weights, read before the wait, must fit in registers.

`FusedStep` with `fused.layer_tiles` patched (batch 1 only: qkv, c_fc and mlp.c_proj; the lm_head
and the attention as they are) against the library's tiles ("default") and the split ("split"),
under the interleaved driver, prompt 16 mixed, 100 new tokens: ms per step
(`measure.measure_calls`, alternated, 10 rounds), tokens against model.generate and the default
step.
Usage: python tools/probe_whole_k.py OUT_DIR [NAME ...] (default: NAMES; see `whole_k`)"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps, with_attr


def whole_k(name):
    """layer_tiles for name "a{n}w{w}_p{n}w{w}": at batch 1, the GEMVs of K <= 1024 (a: qkv,
    c_fc) and of larger K (p: mlp.c_proj) read all of K as one tile, n columns a program,
    w warps; "pd": mlp.c_proj split (gemv's defaults); "split": every GEMV split. The lm_head
    as it is (not a layer GEMV)."""
    groups = {}
    for part in name.split("_") if name != "split" else []:
        if part[1:] != "d":
            n, w = part[1:].split("w")
            groups[part[0]] = dict(block_k=4096, block_n=int(n), num_warps=int(w))

    def tiles(B, K, N, dtype):
        if B != 1:
            return {}
        return groups.get("a" if K <= 1024 else "p", {})
    return tiles


NAMES = ["split", "a16w8_pd", "a16w8_p16w16", "a16w8_p8w16", "a16w8_p8w8", "a8w4_p8w16",
         "a16w4_p8w16"]


def with_tiles(name, step=fused.FusedStep):
    """`step` with `whole_k(name)` in place of `fused.layer_tiles` while it builds its buffers
    and captures its graphs."""
    return with_attr(step, name, fused, "layer_tiles", whole_k(name))


def main(out, names):
    out.mkdir(parents=True, exist_ok=True)
    steps = {"default": fused.FusedStep} | {n: with_tiles(n) for n in names}
    df = compare_steps(steps, (torch.float32, torch.bfloat16), (1,), "tiles", same_as="default")
    df.to_csv(out / "step_whole_k.csv", index=False)
    return df


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:] or NAMES)

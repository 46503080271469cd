"""Issue 14: at batch 1, the layer GEMVs reading W with K contiguous ([N, K] in memory, as the
lm_head's weight is) instead of GPT-2's Conv1D layout [K, N] (N contiguous).

With N contiguous, a program's tile of n columns is K rows of n elements each: 32 bytes a row
for 16 bfloat16 columns, one memory sector. Fewer columns a program waste part of each sector
(8 bfloat16 columns: half), so a 768-column projection gets at most 48 programs for the GPU's
132 SMs, each streaming 96 KB (results/h200/fused/whole_k/). With K contiguous, a program of n
columns reads n runs of K elements: whole sectors at any n, so the same GEMV can have 4-8 times
as many programs, each with a fraction of the bytes to stream before its PDL wait.

`FusedStep` whose layer GEMVs (at batch 1 qkv, c_fc, mlp.c_proj; the attention's projection
and the lm_head as they are; at batch 32 attn.c_proj too) get a copy of their weight with K
contiguous (same shape [K, N], strides (1, K)) and, at batch 1, the tiles of `kt(name)`,
against the library's step ("default"), under the interleaved driver, prompt 16 mixed, 100
new tokens: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens against
model.generate and the default step. (The run in results/h200/fused/layout/ was made at commit
c65f0f0, before the library adopted `kt_a8w4_p4w8`: there "default" read GPT-2's Conv1D layout
with the tiles of results/h200/fused/whole_k/.) At batch 32 (gemv's own tiles) only "lib" runs, if
named: the layout alone.
Usage: python tools/probe_layout.py OUT_DIR [NAME ...] (default: NAMES; see `kt`)"""
import pathlib
import sys
import weakref

import pandas as pd
import torch

from fastgen_lib import fused
from step_ab import compare_steps, patched_step

COPIES = {}  # (address, dtype, shape) -> (weakref to the model's weight, its K-contiguous copy)


def k_contiguous(w):
    """w [K, N] with K contiguous: strides (1, K), made once per weight and kept."""
    key = (w.data_ptr(), w.dtype, tuple(w.shape))
    ref, copy = COPIES.get(key, (None, None))
    if ref is None or ref() is not w:
        copy = w.t().contiguous().t()
        COPIES[key] = (weakref.ref(w), copy)
    return copy


def groups(name):
    """{"a"|"p"|"l": dict(block_k=4096, block_n=n, num_warps=w)} from name "a{n}w{w}_p{n}w{w}"
    (and optionally "_l{n}w{w}"); {} for "lib"."""
    out = {}
    for part in name.split("_") if name != "lib" else []:
        n, w = part[1:].split("w")
        out[part[0]] = dict(block_k=4096, block_n=int(n), num_warps=int(w))
    return out


def kt(name):
    """layer_tiles for name "a{n}w{w}_p{n}w{w}": at batch 1, the GEMVs of K <= 1024 (a: qkv,
    c_fc) and of larger K (p: mlp.c_proj) read all of K as one tile, n columns a program,
    w warps; "lib" keeps the library's tiles (the layout alone changes)."""
    tiles_of = groups(name)

    def tiles(B, K, N, dtype):
        if B != 1:
            return {}
        if "a" not in tiles_of:
            return LAYER_TILES(B, K, N, dtype)
        return tiles_of["a" if K <= 1024 else "p"]
    return tiles


LAYER_TILES, GEMV, GEMV_TILES = fused.layer_tiles, fused.gemv, fused.gemv_tiles
STEP_WEIGHTS = fused.step_weights  # (the library's copies since it adopted this probe's result)
NAMES = ["lib", "a8w4_p4w8", "a8w8_p4w8", "a4w4_p2w4", "a8w4_p2w8", "a16w4_p4w4",
         "a4w4_p4w8"]


def with_layout(name):
    """FusedStep with `kt(name)` for `fused.layer_tiles` and every layer GEMV given its
    weight with K contiguous, while it builds its buffers and captures its graphs. With an
    "l" part, the lm_head at batch 1 reads all of K as one tile too, with its columns and
    warps (its per-tile maxima sized to match)."""
    lm = groups(name).get("l")

    def gemv(x, weight, bias, **kw):
        if weight.stride(1) == 1:  # a layer's Conv1D weight, not the lm_head's [V, E].t()
            weight = k_contiguous(weight)
        elif lm and x.shape[0] == 1 and "argmax" in kw:  # the lm_head
            kw = kw | lm
        return GEMV(x, weight, bias, **kw)

    def gemv_tiles(B, K, N, device, block_n=None, block_k=None, **kw):
        if lm and B == 1 and N > 10000 and block_n is None:  # the lm_head's, for Buffers
            block_n, block_k = lm["block_n"], lm["block_k"]
        return GEMV_TILES(B, K, N, device, block_n=block_n, block_k=block_k, **kw)

    def own(model, k_contiguous, out=None):  # the model's weights: `gemv` above copies them
        return STEP_WEIGHTS(model, False)

    def patch():
        fused.layer_tiles, fused.gemv, fused.gemv_tiles = kt(name), gemv, gemv_tiles
        fused.step_weights = own

        def undo():
            fused.layer_tiles, fused.gemv, fused.gemv_tiles = LAYER_TILES, GEMV, GEMV_TILES
            fused.step_weights = STEP_WEIGHTS
        return undo
    return patched_step(fused.FusedStep, patch, "kt_" + name)


def main(out, names):
    out.mkdir(parents=True, exist_ok=True)
    steps = {"default": fused.FusedStep} | {"kt_" + n: with_layout(n) for n in names}
    b1 = compare_steps(steps, (torch.bfloat16, torch.float32), (1,), "layout",
                       same_as="default")
    b1.to_csv(out / "step_layout.csv", index=False)
    lib = {k: v for k, v in steps.items() if k in ("default", "kt_lib")}
    if len(lib) < 2:  # no "lib": batch 1 only
        return b1
    b32 = compare_steps(lib, (torch.float32, torch.bfloat16), (32,), "layout",
                        same_as="default")
    df = pd.concat([b1, b32])
    df.to_csv(out / "step_layout.csv", index=False)
    return df


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2:] or NAMES)

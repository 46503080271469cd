"""Issue 14: at batch 1, the attention and the out-projection (attn.c_proj) in one kernel
(`fused.attention_proj`): head h's output is rows h*D.. of c_proj's K, so each program attends
with one head and multiplies by its rows of W, and the last program of a column tile adds the
heads' partial sums (one kernel and one round trip through memory fewer a layer, for more reads
of the cache: each column tile attends again). `FusedStep` as it is (`default`: 64 columns a
tile, 4 warps) against the step with the two kernels it replaces (`separate`: `attention` with
early cache reads, then `gemv`) and with 128 columns a tile (`n128`; 32 columns and 8 warps
measured slower: results/h200/fused/attention_proj/), and with two kernels that need no
counter (`separate_whole_k`: `attention` with one program per row and head, whose 128 keys hold
GPT-2's 116 slots, then `gemv` reading all of K as `fused.layer_tiles` has it at batch 1),
under the interleaved driver, batch 1,
prompt 16 mixed, 100 new tokens, float32 and bfloat16: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens.
Usage: python tools/probe_attention_proj.py OUT_DIR"""
import pathlib
import sys

import torch

from fastgen_lib import fused
from step_ab import compare_steps, patched_step


def separate(q, keys, values, mask, col, weight, bias, residual, out=None, scratch=None,
             pdl=False, **kw):
    """What `attention_proj` replaces: `attention` (early cache reads) into a buffer, then `gemv`."""
    a = torch.empty_like(q)
    fused.attention(q, keys, values, mask, col, out=a, scratch=scratch, pdl=pdl, early_kv=True)
    return fused.gemv(a, weight, bias, residual=residual, out=out, scratch=scratch, pdl=pdl)


def separate_whole_k(q, keys, values, mask, col, weight, bias, residual, out=None,
                     scratch=None, pdl=False, **kw):
    """Two kernels without a counter at GPT-2's cache lengths: `attention` with 128 keys a
    program (one program per row and head up to 128 slots: no blocks to combine), then `gemv`
    with `fused.layer_tiles`' tiles (at batch 1 all of K one tile: no partial sums)."""
    a = torch.empty_like(q)
    fused.attention(q, keys, values, mask, col, out=a, scratch=scratch, pdl=pdl, early_kv=True,
                    block_s=128)
    return fused.gemv(a, weight, bias, residual=residual, out=out, scratch=scratch, pdl=pdl,
                      **fused.layer_tiles(q.shape[0], *weight.shape, weight.dtype))


def with_attention_proj(name, fn=None, step=fused.FusedStep, **tiles):
    """`step` (a FusedStep class) with `fused.attention_proj` replaced by `fn`, or called with
    `tiles`, while it captures its graphs."""
    def patch():
        saved = fused.attention_proj
        fused.attention_proj = fn or (lambda *args, **kw: saved(*args, **(kw | tiles)))

        def undo():
            fused.attention_proj = saved
        return undo

    return patched_step(step, patch, name)


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    steps = {"default": fused.FusedStep, "separate": with_attention_proj("separate", separate),
             "n128": with_attention_proj("n128", block_n=128),
             "separate_whole_k": with_attention_proj("separate_whole_k", separate_whole_k)}
    compare_steps(steps, (torch.float32, torch.bfloat16), (1,), "step",
                  same_as="default").to_csv(out / "step_attention_proj.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

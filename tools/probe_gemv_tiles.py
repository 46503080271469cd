"""Issue 14: the fused step's time per step with other GEMV tiles. With PDL a GEMV reads its first
weight tile before it waits for the kernel ahead; the rest of its chunk of K comes after the wait,
on the step's critical path. With block_k = 128 a chunk is one tile at GPT-2's shapes (fewer,
longer programs). `FusedStep` with `gemv`'s defaults (block_k 64, 4 programs per SM) against steps
whose GEMVs use other (block_k, programs_per_sm), under the interleaved driver, prompt 16 mixed,
100 new tokens: ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens against
model.generate.
Usage: python tools/probe_gemv_tiles.py OUT_DIR [BLOCK_K:PROGRAMS_PER_SM ...] (default: TILES)"""
import pathlib
import sys

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import fused, measure, stops
from fastgen_lib.decoders import decode
from fastgen_lib.models import EOS
from fastgen_lib.reference import first_divergence, hf_generate
from fastgen_lib.steps import GenConfig

TILES = [(128, 4), (128, 8), (32, 4)]  # (block_k, programs_per_sm); the default is (64, 4)


def with_tiles(block_k, programs_per_sm):
    """A FusedStep whose GEMVs use these tiles (`gemv`'s and `scratch_size`'s defaults, set while
    it builds its buffers and captures its graphs)."""
    def patched(f, *args):
        saved = fused.gemv.__kwdefaults__.copy(), fused.gemv_tiles.__defaults__
        fused.gemv.__kwdefaults__.update(block_k=block_k, programs_per_sm=programs_per_sm)
        fused.gemv_tiles.__defaults__ = (None, block_k, programs_per_sm)
        try:
            return f(*args)
        finally:
            fused.gemv.__kwdefaults__.clear()
            fused.gemv.__kwdefaults__.update(saved[0])
            fused.gemv_tiles.__defaults__ = saved[1]

    class Tiles(fused.FusedStep):
        def __init__(self, *args):
            patched(super().__init__, *args)

        def run(self, slot):
            patched(super().run, slot)

    Tiles.__name__ = f"k{block_k}_p{programs_per_sm}"
    return Tiles


def main(out, tiles=TILES, N=100):
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = fg.load_model("124m", device="cuda", dtype=dtype)
        for batch in (1, 32):
            ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
            ref = hf_generate(model, ids, mask, N, EOS, EOS)

            def call(step):
                def c(n=N):
                    gen = GenConfig(n, (EOS,), EOS, max_cache_len=16 + N)
                    return decode(model, ids, mask, gen, step, stops.interleaved)
                return c

            calls = {"k64_p4": call(fused.FusedStep)}
            calls |= {s.__name__: call(s) for s in (with_tiles(*t) for t in tiles)}
            timed, outs = measure.measure_calls(model, ids, calls, N, repeats=10)
            for r in timed:
                o = outs[r["method"]]
                rows.append({"dtype": str(dtype).split(".")[-1], "batch": batch,
                             "tiles": r["method"], "ms_per_step": r["ms_per_step"],
                             "q1": r["ms_per_step_q1"], "q3": r["ms_per_step_q3"],
                             "tokens_equal_default": torch.equal(o, outs["k64_p4"]),
                             "tokens_equal_model_generate": torch.equal(o, ref),
                             "divergence": first_divergence(model, ids, mask, ref, o)})
                print(rows[-1], flush=True)
        del model
        torch.cuda.empty_cache()
    name = "_".join(f"k{k}_p{p}" for k, p in tiles) if tiles != TILES else "gemv_tiles"
    pd.DataFrame(rows).to_csv(out / f"step_{name}.csv", index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]),
         [tuple(map(int, t.split(":"))) for t in sys.argv[2:]] or TILES)

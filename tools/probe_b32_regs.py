"""Issue 14, batch 32 (float32 target 0.6 ms a step; 0.83 measured): do the step's GEMVs hold
too many registers? With the library's tiles each batch-32 float32 GEMV holds 138-181
registers a thread (`registers.csv`): two or three programs of 4 warps an SM. Two levers: a
shorter tile of K (three TF32 products of a shorter tile hold fewer registers), and the split's
last program, whose unrolled loop loads all SPLIT partial tiles at once. Here the step
(`FusedStep`, interleaved driver, prompt 16 mixed, 100 new tokens, the variants alternated, 10
rounds; `step_ab.compare_steps`) with the GEMVs' block_k (`fused.default_tiles`) and the
partial sums loaded at once (`fused.SPLIT_LOADS`) patched, against the library's, in float32
and bfloat16; then each variant's shares of the step (`probe_step_order.step_kernels`) and the
registers of every compiled GEMV. Not adopted (results/h200/fused/b32_regs/README.md): the
library has no SPLIT_LOADS; the probe runs with its patch applied:
    git apply results/h200/fused/b32_regs/loads.patch
Usage: python tools/probe_b32_regs.py OUT_DIR"""
import pathlib
import sys

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import fused, stops, traces
from fastgen_lib.decoders import decode
from fastgen_lib.models import EOS
from fastgen_lib.steps import GenConfig
from probe_step_order import step_kernels
from step_ab import compare_steps, patched_step

B, N = 32, 100
VARIANTS = {  # name: (block_k, split loads) at batch 32; None: the library's
    torch.float32: {"library": None, "k32_loads4": (32, 4), "k16": (16, 64),
                    "k16_loads4": (16, 4), "k16_loads2": (16, 2)},
    torch.bfloat16: {"library": None, "k128_loads2": (128, 2), "k64_loads2": (64, 2),
                     "k32_loads2": (32, 2)},
}


def variant(name, choice):
    if choice is None:
        return fused.FusedStep
    block_k, loads = choice

    def patch():
        tiles, saved_loads = fused.default_tiles, fused.SPLIT_LOADS

        def default_tiles(b, dtype):
            return (block_k, tiles(b, dtype)[1]) if b == B else tiles(b, dtype)
        fused.default_tiles, fused.SPLIT_LOADS = default_tiles, loads

        def undo():
            fused.default_tiles, fused.SPLIT_LOADS = tiles, saved_loads
        return undo
    return patched_step(fused.FusedStep, patch, name)


def registers():
    """Every compiled `_gemv_kernel`: registers, spills and its tile constants."""
    names, rows = fused._gemv_kernel.arg_names, []
    keep = ["PRECISION", "BLOCK_M", "LN", "QKV", "GELU", "RESIDUAL", "ARGMAX", "EMBED", "SPLIT",
            "LOADS", "BLOCK_K", "BLOCK_N"]
    for cache in fused._gemv_kernel.device_caches.values():
        for k in cache[0].values():
            c = getattr(getattr(k, "src", None), "constants", {}) or {}
            named = {names[key[0] if isinstance(key, tuple) else key]: v for key, v in c.items()}
            rows.append({"n_regs": getattr(k, "n_regs", None),
                         "n_spills": getattr(k, "n_spills", None)}
                        | {n: named.get(n) for n in keep})
    return rows


def main(out):
    if not hasattr(fused, "SPLIT_LOADS"):
        sys.exit("apply results/h200/fused/b32_regs/loads.patch first (fused.SPLIT_LOADS)")
    out.mkdir(parents=True, exist_ok=True)
    steps, orders = [], []
    for dtype, variants in VARIANTS.items():
        classes = {n: variant(n, c) for n, c in variants.items()}
        steps.append(compare_steps(classes, (dtype,), (B,), "variant", same_as="library"))
        model = fg.load_model("124m", device="cuda", dtype=dtype)
        ids, mask = fg.make_batch(B, 16, seed=B, device="cuda")
        for n, cls in classes.items():
            def call(cls=cls):
                gen = GenConfig(N, (EOS,), EOS, max_cache_len=16 + N)
                with torch.inference_mode(), torch.profiler.record_function("fastgen.x"):
                    return decode(model, ids, mask, gen, cls, stops.interleaved)
            call(), call()
            d, _ = step_kernels(traces.profile_decode(call), B, model.config.n_layer)
            by = d.groupby("role").share_us.median() * model.config.n_layer
            by["lm_head"] /= model.config.n_layer
            by["token choice"] /= model.config.n_layer
            print(n, str(dtype)[6:], by.round(1).to_dict(), flush=True)
            orders.append({"dtype": str(dtype)[6:], "variant": n, **by.to_dict()})
        del model
        torch.cuda.empty_cache()
    pd.concat(steps).to_csv(out / "step_b32_regs.csv", index=False)
    pd.DataFrame(orders).to_csv(out / "step_b32_regs_order.csv", index=False)
    regs = registers()
    pd.DataFrame(regs).to_csv(out / "registers.csv", index=False)
    for r in regs:
        print(r, flush=True)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

"""Shared by the fused step's probes: step backends timed side by side (tools/probe_pdl.py,
probe_mlp.py, probe_gemv_tiles.py) and one kernel timed inside a CUDA graph (tools/tune_fused.py,
tune_attention.py), and a library kernel with source lines replaced (`kernel_variant`, `swap_kernels`, `kernels_in_place`:
probe_b32_ln.py, probe_early_epilogue.py). Imported by those scripts, which run from the repo root as
`python tools/NAME.py`."""
import contextlib
import importlib.util
import inspect
import pathlib
import textwrap

import pandas as pd
import torch
import triton

import fastgen_lib as fg
from fastgen_lib import measure, stops
from fastgen_lib.decoders import decode
from fastgen_lib.models import EOS
from fastgen_lib.reference import first_divergence, hf_generate
from fastgen_lib.steps import GenConfig


def compare_steps(steps, dtypes, batches, column, same_as=None, N=100, size="124m",
                  device="cuda", repeats=10):
    """The step backends `steps` ({name: step class}) side by side on GPT-2 `size`, for each dtype
    and batch: prompt 16 mixed, N new tokens, the interleaved driver; ms per step from
    `measure.measure_calls` (a N-token call minus a 1-token call, all alternated, `repeats`
    rounds), their tokens against model.generate's and, with `same_as`, against that step's.
    One row per (dtype, batch, step), the step's name in `column`; printed as they come."""
    rows = []
    for dtype in dtypes:
        model = fg.load_model(size, device=device, dtype=dtype)
        for batch in batches:
            ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device=device)
            ref = hf_generate(model, ids, mask, N, EOS, EOS)

            def call(step):
                def c(n=N):
                    gen = GenConfig(n, (EOS,), EOS, max_cache_len=16 + N)
                    return decode(model, ids, mask, gen, step, stops.interleaved)
                return c

            timed, outs = measure.measure_calls(
                model, ids, {name: call(s) for name, s in steps.items()}, N, repeats=repeats)
            for r in timed:
                o = outs[r["method"]]
                rows.append({"dtype": str(dtype).split(".")[-1], "batch": batch,
                             column: r["method"], "ms_per_step": r["ms_per_step"],
                             "q1": r["ms_per_step_q1"], "q3": r["ms_per_step_q3"]}
                            | ({f"tokens_equal_{same_as}": torch.equal(o, outs[same_as])}
                               if same_as else {})
                            | {"tokens_equal_model_generate": torch.equal(o, ref),
                               "divergence": first_divergence(model, ids, mask, ref, o)})
                print(rows[-1], flush=True)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def bench_graph(fn, calls=20):
    """Microseconds per call of `fn(i)`, i = 0..calls-1, captured as one CUDA graph whose replay
    triton.testing.do_bench times (median, L2 flushed before each replay)."""
    fn(0)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    return triton.testing.do_bench(g.replay, warmup=5, rep=20) * 1e3 / calls


def patched_step(step, patch, name):
    """A subclass of the step class `step`, named `name`, that builds its buffers and captures its
    graphs (`__init__`, `run`) with `patch()` in force: `patch` changes some default of the
    library and returns a function that puts it back."""
    class Patched(step):
        def __init__(self, *args):
            undo = patch()
            try:
                super().__init__(*args)
            finally:
                undo()

        def run(self, slot):
            undo = patch()
            try:
                super().run(slot)
            finally:
                undo()

    Patched.__name__ = name
    return Patched


def with_attr(step, name, module, attr, value):
    """`patched_step(step, ..., name)` whose patch sets `module.attr` to `value` (a tile
    choice, say) and puts the old one back."""
    def patch():
        saved = getattr(module, attr)
        setattr(module, attr, value)
        return lambda: setattr(module, attr, saved)
    return patched_step(step, patch, name)


def kernel_variant(name, edits, tmp):
    """`fastgen_lib.fused.<name>` (a triton.jit kernel) with each (old, new) of `edits`
    replaced in its source (each `old` exactly once), as a new kernel loaded from a module
    written under `tmp`."""
    from fastgen_lib import fused
    src = textwrap.dedent(inspect.getsource(getattr(fused, name).fn))
    for old, new in edits:
        assert src.count(old) == 1, f"{old!r} is not once in fused.{name}"
        src = src.replace(old, new)
    head = ("import triton\nimport triton.language as tl\n"
            "from fastgen_lib.fused import _weight_tile, _softmax_block, SQRT_2_OVER_PI\n\n\n")
    path = pathlib.Path(tmp) / f"{name}_variant_{abs(hash(src))}.py"
    path.write_text(head + src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def swap_kernels(kernels):
    """`patched_step`'s patch: `kernels` ({name: kernel}, say from `kernel_variant`) in
    `fastgen_lib.fused` in place of the library's, and the function that puts those back."""
    from fastgen_lib import fused
    saved = {name: getattr(fused, name) for name in kernels}
    for name, kernel in kernels.items():
        setattr(fused, name, kernel)

    def undo():
        for name, kernel in saved.items():
            setattr(fused, name, kernel)
    return undo


@contextlib.contextmanager
def kernels_in_place(kernels):
    """`swap_kernels(kernels)` for the block: the library's functions launch `kernels` inside."""
    undo = swap_kernels(kernels)
    try:
        yield
    finally:
        undo()

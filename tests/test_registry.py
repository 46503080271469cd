"""The registry (`fastgen_lib/registry.py`) is the one list of methods: every other list reads it,
and every figure draws every registered method."""
import importlib

import matplotlib
import numpy as np
import pandas as pd
import pytest

import fastgen_lib as fg
from fastgen_lib import __main__ as cli
from fastgen_lib import bench, plots, reference, registry

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def test_every_list_reads_the_registry():
    names = list(registry.METHODS)
    assert list(fg.DECODERS) == list(registry.DECODER_NAMES)
    assert list(registry.DECODER_NAMES) + list(registry.HF_NAMES) == names
    assert list(reference.HF_REFERENCE) == list(registry.DECODER_NAMES)
    assert list(bench.HF_METHODS) == list(registry.HF_NAMES)
    assert plots.ORDER == names and set(plots.COLORS) == set(plots.LABELS) == set(names)
    assert len(set(plots.COLORS.values())) == len(names)  # a colour each
    p = cli.parser()
    sub = p._subparsers._group_actions[0].choices
    decoder = next(a for a in sub["generate"]._actions if a.dest == "decoder")
    assert tuple(decoder.choices) == registry.DECODER_NAMES
    assert set(bench.HEADLINE) <= set(names) and set(bench.LADDER) <= set(names)
    from fastgen_lib import widgets
    assert widgets.decoder_picker().options == registry.DECODER_NAMES


def test_each_decoder_names_a_step_and_a_driver_that_declare_their_contract():
    from fastgen_lib import stops
    for name, m in registry.METHODS.items():
        if not m.step:
            continue
        if "triton" in m.needs and not registry.have("triton"):
            continue
        backend, driver = (getattr(importlib.import_module(f"fastgen_lib.{mod}"), attr)
                           for mod, attr in (ref.split(":") for ref in (m.step, m.stop)))
        assert isinstance(driver, stops.Driver), name
        assert isinstance(backend.offers(fg.decoders.GenConfig(4, None, 0)), frozenset), name


def rows(methods, batches=(1, 32), new_tokens=(100,)):
    """Made-up result rows, one per method and workload, with every column a figure reads."""
    out = []
    for i, m in enumerate(methods):
        for b in batches:
            for n in new_tokens:
                ms = 0.2 + i
                out.append(dict(method=m, batch=b, max_new_tokens=n, new_tokens=n, prompt_len=16,
                                dtype="float32", ms_per_step=ms, ms_per_step_q1=ms * 0.9,
                                ms_per_step_q3=ms * 1.1, tokens_per_s=b * 1e3 / ms,
                                median_s=ms * n / 1e3, floor_ms_per_step=0.1, repeats=10,
                                gpu="H200", torch="2.11", transformers="5.17.0", params_m=124.0))
    return pd.DataFrame(out)


def texts(fig):
    """Every string a figure shows: tick labels, legends, annotations."""
    found = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    return " | ".join(found)


@pytest.mark.parametrize("draw", ["ladder_bars", "sweep_lines", "ladder_overview",
                                  "sweep_tokens"])
def test_every_figure_draws_every_registered_method(draw):
    names = list(registry.METHODS)
    df = rows(names)
    one = df[df.batch == 1]
    fig = {"ladder_bars": lambda: plots.ladder_bars(one),
           "sweep_lines": lambda: plots.sweep_lines(df),
           "ladder_overview": lambda: plots.ladder_overview(df),
           "sweep_tokens": lambda: plots.sweep_tokens(df, methods=names)}[draw]()
    shown = texts(fig)
    plt.close(fig)
    for m in names:
        assert m in shown or plots.LABELS[m] in shown, (draw, m)
    assert np.isfinite(df.ms_per_step).all()


def test_bench_runs_only_what_this_machine_has():
    here = bench.runnable(registry.METHODS)
    for name in here:
        assert all(registry.have(n) for n in registry.METHODS[name].needs)
    if not registry.have("cuda"):
        assert "fused" not in here and "gpu_loop" not in here
        assert bench.runnable(bench.HEADLINE) == ["naive", "interleaved", "hf_dynamic",
                                                  "hf_static"]

"""tools/probe_b32_epilogue.py: the batch-32 layer GEMVs with the step's additions switched on
one at a time (LayerNorm, the cache write, GELU, the residual, PDL, the kernel ahead writing x),
to be timed on the H200. Each variant must run and compute what the step computes; on a CPU
under Triton's interpreter (tests/conftest.py), at a small size, without PDL (a GPU feature)."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_b32_epilogue as probe  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = {"c_attn": (64, 192), "attn.c_proj": (64, 64), "c_fc": (64, 256), "mlp.c_proj": (256, 64)}


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(probe, "SHAPES", SMALL)
    monkeypatch.setattr(probe, "B", 3)
    monkeypatch.setattr(probe, "H", 2)
    monkeypatch.setattr(probe, "L", 8)


def test_variants_switch_each_addition_then_all_then_after():
    names = [label for label, _ in probe.variants("c_attn")]
    assert names == ["plain", "ln", "qkv", "ln+qkv", "plain+pdl", "ln+pdl", "qkv+pdl",
                     "ln+qkv+pdl", "ln+qkv+pdl+after"]
    assert [label for label, _ in probe.variants("mlp.c_proj")][-1] == "residual+pdl+after"


@pytest.mark.parametrize("name", list(SMALL))
def test_every_variant_runs(small, name):
    for label, features in probe.variants(name):
        if DEVICE == "cpu":  # PDL is a launch option of Hopper GPUs
            features = tuple(f for f in features if f != "pdl")
        y = probe.layer_call(name, features, torch.float32, device=DEVICE, calls=2)(1)
        assert torch.isfinite(y).all() and y.shape[0] == 3, label


def test_the_steps_c_attn_writes_q_and_the_cache_column(small):
    # LayerNorm folded in, q into the result, K and V into the cache at column `col`
    fn = probe.layer_call("c_attn", ("ln", "qkv"), torch.float32, device=DEVICE, calls=2)
    q = fn(1)
    with torch.no_grad():
        want = fn.ln(fn.x) @ fn.ws[1] + fn.b
    E, col = 64, int(fn.col)
    torch.testing.assert_close(q, want[:, :E], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fn.keys[:, :, col].reshape(3, E), want[:, E:2 * E],
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fn.values[:, :, col].reshape(3, E), want[:, 2 * E:],
                               rtol=1e-4, atol=1e-4)


def test_after_rows_subtract_the_gemv_ahead_alone(tmp_path, monkeypatch):
    # the bookkeeping, with a stand-in for the GPU timer: a pair takes 25 µs, a GEMV alone 10
    import step_ab
    monkeypatch.setattr(probe, "layer_call", lambda name, features, dtype: (name, features))
    monkeypatch.setattr(step_ab, "bench_graph",
                        lambda call: 25.0 if "after" in call[1] else 10.0 + len(call[1]))
    probe.main(tmp_path)
    import pandas as pd
    d = pd.read_csv(tmp_path / "b32_epilogue.csv")
    after = d[d.variant.str.endswith("+after")].set_index(["dtype", "name"]).us
    # the one ahead alone ran with its step features and PDL: 10 + their count
    assert after[("float32", "c_attn")] == 25 - (10 + 2)    # mlp.c_proj: residual, pdl
    assert after[("float32", "c_fc")] == 25 - (10 + 2)      # attn.c_proj: residual, pdl
    assert after[("bfloat16", "mlp.c_proj")] == 25 - (10 + 3)  # c_fc: ln, gelu, pdl
    assert len(d) == 2 * sum(len(probe.variants(n)) for n in probe.SHAPES)

"""tools/probe_b32_ln.py: `fused._gemv_kernel` with a few source lines replaced, to time what
the folded LayerNorm and the cache write cost at batch 32 on the H200. Every edit must still
find its line in the library's kernel, and every variant not marked `bound_` must compute the
library's result (the bounds only run); on a CPU under Triton's interpreter (tests/conftest.py), at a small size."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_b32_epilogue as epilogue  # noqa: E402
import probe_b32_ln as probe  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(epilogue, "SHAPES", {"c_attn": (64, 192), "c_fc": (64, 256)})
    monkeypatch.setattr(epilogue, "B", 3)
    monkeypatch.setattr(epilogue, "H", 2)
    monkeypatch.setattr(epilogue, "L", 8)


def run(name, features, kernel=None):
    fn = epilogue.layer_call(name, features, torch.float32, device=DEVICE, calls=1)
    if kernel is None:
        return fn(0).clone(), fn
    with probe.kernel_in_place(kernel):
        return fn(0).clone(), fn


# GELU is x * sigmoid(2u): for a very negative x, exp(-2u) overflows to inf and the sigmoid is
# exactly 0, as on the GPU; Triton's CPU interpreter computes it in NumPy, which warns
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("name", list(probe.CASES))
def test_variants_compute_the_library_result_or_are_marked_bound(small, tmp_path, name):
    features = probe.CASES[name]
    want, fn = run(name, features)
    want_k = fn.keys.clone()
    for v, edits in probe.VARIANTS.items():
        if "qkv" in v and "qkv" not in features:
            continue
        got, fn = run(name, features, probe.variant_kernel(edits, tmp_path))
        assert torch.isfinite(got).all(), v
        if not v.startswith("bound_"):  # (a bound's result may be wrong)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=v)
            torch.testing.assert_close(fn.keys, want_k, atol=1e-5, rtol=1e-5, msg=v)


def test_kernel_in_place_puts_the_library_kernel_back(tmp_path):
    library = probe.fused._gemv_kernel
    with pytest.raises(RuntimeError):
        with probe.kernel_in_place(probe.variant_kernel([], tmp_path)):
            assert probe.fused._gemv_kernel is not library
            raise RuntimeError
    assert probe.fused._gemv_kernel is library


def test_an_edit_that_no_longer_matches_says_so(tmp_path):
    with pytest.raises(AssertionError, match="not once"):
        probe.variant_kernel([("no such line", "")], tmp_path)

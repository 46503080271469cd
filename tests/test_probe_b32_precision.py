"""tools/probe_b32_precision.py: each bound's edit must still find the library's dot line, and
its kernel must compile and run (under Triton's CPU interpreter the dot is float32 whatever the
precision asked, so the result equals the library's there); the step classes put the library's
kernel back after capture."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_b32_precision as probe  # noqa: E402
from probe_b32_ln import kernel_in_place  # noqa: E402

fused = probe.fused
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("name", [v for v in probe.VARIANTS if v != "library"])
def test_each_bound_runs_where_the_library_runs(tmp_path, name):
    g = torch.Generator(device="cpu").manual_seed(2)
    x = torch.randn(3, 64, generator=g).to(DEVICE)
    w = (torch.randn(64, 256, generator=g) * 0.125).to(DEVICE)
    b = torch.zeros(256, device=DEVICE)
    block_n = 128 if DEVICE == "cpu" else 64
    top = torch.empty(3, 256 // block_n, device=DEVICE)
    top_i = torch.empty(3, 256 // block_n, dtype=torch.int32, device=DEVICE)
    want = fused.gemv(x, w, b, argmax=(top, top_i), block_n=block_n, split=1).clone()
    want_i = top_i.clone()
    with kernel_in_place(probe.variant_kernel(probe.VARIANTS[name], tmp_path)):
        got = fused.gemv(x, w, b, argmax=(top, top_i), block_n=block_n, split=1)
    if DEVICE == "cpu":  # the interpreter's dot ignores the precision
        assert torch.equal(got, want) and torch.equal(top_i, want_i)
    else:  # one TF32 product: within its 10 bits of mantissa
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_the_step_classes_put_the_library_kernel_back(tmp_path):
    library = fused._gemv_kernel
    steps = probe.steps(tmp_path)
    assert steps["library"] is fused.FusedStep and set(steps) == set(probe.VARIANTS)
    assert fused._gemv_kernel is library

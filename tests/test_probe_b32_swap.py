"""tools/probe_b32_swap.py: a batch-32 GEMV with the operands swapped (y^T = W^T x^T, the weight's
columns as the MMA's rows), to be timed on the H200 against `fused.gemv`. Its sums must be
x @ W + b whatever the tiles: columns and K not multiples of the tile, K split or not, and
again on the same counters (each column tile's last program resets its own). Without CUDA it
runs under Triton's CPU interpreter (tests/conftest.py), with IEEE dots."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_b32_swap as probe  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"


@pytest.mark.parametrize("K, N", [(96, 80), (192, 40)])
@pytest.mark.parametrize("tiles", [dict(block_n=64, block_k=32, split=1),
                                   dict(block_n=32, block_k=32, split=3),
                                   dict(block_n=64, block_k=64, split=2)])
def test_swap_gemv_sums_x_at_w_plus_b(K, N, tiles, monkeypatch):
    monkeypatch.setattr(probe, "SHAPES", {"t": (K, N)})
    precision = "tf32x3" if GPU else "ieee"
    fn, out, err, _ = probe.swap_call("t", tiles, precision, device=DEVICE, calls=2)
    assert err < 1e-4, err
    x, ws, b = probe.operands("t", DEVICE, 2)
    fn(1)  # the second weight, on the counters the first call left
    want = x.double() @ ws[1].double() + b.double()
    assert (out.double() - want).abs().max().item() < 1e-4

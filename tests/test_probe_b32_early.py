"""tools/probe_b32_early.py: at batch > 1 a chunk of K that is one tile is summed from the tile
read before the PDL wait (the library); the probe's `late` kernel reads it again after the wait.
Both must give the same bits for the same tiles, and the probe's patch must put the library
back; on a CPU under Triton's interpreter (tests/conftest.py), at a small size."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_b32_early as probe  # noqa: E402

fused = probe.fused
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def call(features, K=64, N=96, B=3, **tiles):
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(B, K, generator=g).to(DEVICE)
    w = (torch.randn(K, N, generator=g) * K ** -0.5).to(DEVICE)
    b = torch.randn(N, generator=g).to(DEVICE) * 0.1
    ln = fused.fold_layernorm(torch.nn.LayerNorm(K, device=DEVICE), w, b) \
        if "ln" in features else None
    residual = torch.randn(B, N, generator=g).to(DEVICE) if "residual" in features else None
    return fused.gemv(x, w, ln[2] if ln else b, ln=ln, gelu="gelu" in features,
                      residual=residual, **tiles)


@pytest.mark.parametrize("features", [("ln", "gelu"), ("residual",)])
@pytest.mark.parametrize("split", [4, 2])  # one tile a chunk, then two (ONE_TILE off)
def test_the_tile_read_before_or_after_the_wait_gives_the_same_bits(tmp_path, features, split):
    tiles = dict(block_n=32, block_k=16, split=split)
    want = call(features, **tiles)
    with probe.kernel_in_place(probe.variant_kernel(probe.LATE, tmp_path)):
        got = call(features, **tiles)
    assert torch.equal(got, want)
    torch.testing.assert_close(want, call(features, block_n=128, block_k=64, split=1),
                               rtol=1e-4, atol=1e-4)  # (and the sum is right)


def test_patch_puts_the_library_back(tmp_path):
    kernel, tiles = fused._gemv_kernel, fused.default_tiles
    undo = probe.patch(probe.variant_kernel(probe.LATE, tmp_path), probe.tiles_before)()
    assert fused._gemv_kernel is not kernel and fused.default_tiles is probe.tiles_before
    undo()
    assert fused._gemv_kernel is kernel and fused.default_tiles is tiles

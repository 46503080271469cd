"""tools/probe_b32_early.py: at batch > 1 a chunk of K that is one tile is summed from the tile
read before the PDL wait. The edited kernel must give the library's bits for the same tiles (it
only reads the same tile earlier), and `one_tile` must give every layer GEMV chunks of one tile;
on a CPU under Triton's interpreter (tests/conftest.py), at a small size."""
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
@pytest.mark.parametrize("split", [4, 2])  # one tile a chunk, then two (the edit not taken)
def test_the_early_tile_gives_the_librarys_bits(tmp_path, features, split):
    tiles = dict(block_n=32, block_k=16, split=split)
    want = call(features, **tiles)
    with probe.kernel_in_place(probe.variant_kernel(probe.EARLY, tmp_path)):
        got = call(features, **tiles)
    assert torch.equal(got, want)


def test_one_tile_gives_chunks_of_one_tile():
    tiles = probe.one_tile(32, 128, 4)
    for K, N in ((768, 2304), (768, 768), (768, 3072), (3072, 768), (64, 96)):
        t = tiles(32, K, N, torch.float32)
        _, bn, bk, split, k_chunk = fused.gemv_tiles(32, K, N, torch.device("cpu"),
                                                     **{k: v for k, v in t.items()
                                                        if k != "num_warps"})
        assert (bn, k_chunk) == (32, bk) and split * bk >= K > (split - 1) * bk, (K, N, t)
    assert tiles(1, 768, 2304, torch.float32) == fused.layer_tiles(1, 768, 2304, torch.float32)


def test_patch_puts_the_library_back(tmp_path):
    kernel, tiles = fused._gemv_kernel, fused.layer_tiles
    undo = probe.patch(probe.variant_kernel(probe.EARLY, tmp_path), (64, 64, 4))()
    assert fused._gemv_kernel is not kernel and fused.layer_tiles is not tiles
    undo()
    assert fused._gemv_kernel is kernel and fused.layer_tiles is tiles

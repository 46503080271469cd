"""tools/probe_early_epilogue.py: the ninth version's kernels (the GEMV's epilogue reads after
the PDL wait, `attention_proj`'s partial sums in a loop) and the library's, which read them before
the wait and all at once. The same arithmetic: every variant must give the library's bits,
results and cache writes, at batch 1 and 3, with K in one tile a chunk and in several; on a CPU
under Triton's interpreter (tests/conftest.py), at a small size."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the probes' imports
import probe_early_epilogue as probe  # noqa: E402
from step_ab import kernels_in_place  # noqa: E402

fused = probe.fused
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, L = 2, 8


def call(features, B, K=64, N=96, **tiles):
    g = torch.Generator(device="cpu").manual_seed(B)
    x = torch.randn(B, K, generator=g).to(DEVICE)
    w = (torch.randn(K, N, generator=g) * K ** -0.5).to(DEVICE)
    b = torch.randn(N, generator=g).to(DEVICE) * 0.1
    ln_mod = torch.nn.LayerNorm(K, device=DEVICE)
    with torch.no_grad():
        ln_mod.weight.copy_(torch.rand(K, generator=g) + 0.5)
    ln = fused.fold_layernorm(ln_mod, w, b) if "ln" in features else None
    residual = torch.randn(B, N, generator=g).to(DEVICE) if "residual" in features else None
    keys, values = (torch.zeros(B, H, L, N // 3 // H, device=DEVICE) for _ in range(2))
    qkv = (keys, values, torch.tensor(L // 2, device=DEVICE)) if "qkv" in features else None
    y = fused.gemv(x, w, ln[2] if ln else b, ln=ln, gelu="gelu" in features,
                   residual=residual, qkv=qkv, **tiles)
    return y, keys, values


FEATURES = [("ln", "qkv"), ("ln", "gelu"), ("residual",)]


@pytest.mark.parametrize("features", FEATURES)
@pytest.mark.parametrize("B,tiles", [
    (1, dict(block_k=64, block_n=8)),             # one tile of all of K (the batch-1 step)
    (1, dict(block_k=16, block_n=32, split=1)),   # several tiles a program
    (3, dict(block_k=16, block_n=32, split=4)),   # one tile a chunk, split
    (3, dict(block_k=16, block_n=32, split=2)),   # two tiles a chunk
])
def test_early_reads_give_the_library_bits(tmp_path, features, B, tiles):
    want = call(features, B, **tiles)
    for name in probe.VARIANTS:
        with kernels_in_place(probe.variant_kernels(name, tmp_path)):
            got = call(features, B, **tiles)
        for g, w in zip(got, want):
            assert torch.equal(g, w), (name, features, B, tiles)
    ref = call(features, B, block_k=64, block_n=128, split=1)
    torch.testing.assert_close(want[0], ref[0], rtol=1e-4, atol=1e-4)  # (and the sum is right)


@pytest.mark.parametrize("B,H,S,D,col", [(1, 3, 40, 32, 25), (2, 2, 40, 32, 37)])
def test_attention_proj_variants_give_the_library_bits(tmp_path, B, H, S, D, col):
    g = torch.Generator(device="cpu").manual_seed(col)
    q = torch.randn(B, H * D, generator=g).to(DEVICE)
    k, v = (torch.randn(B, H, S, D, generator=g).to(DEVICE) for _ in range(2))
    mask = torch.ones(B, S, dtype=torch.bool, device=DEVICE)
    mask[-1, :3] = False  # left padding
    w = (torch.randn(H * D, 48, generator=g) * (H * D) ** -0.5).to(DEVICE)
    bias, h = torch.randn(48, generator=g).to(DEVICE), torch.randn(B, 48, generator=g).to(DEVICE)
    c = torch.tensor(col, device=DEVICE)

    def run():
        return fused.attention_proj(q, k, v, mask, c, w, bias, h.clone(), block_n=16)
    want = run()
    for name in probe.VARIANTS:
        with kernels_in_place(probe.variant_kernels(name, tmp_path)):
            assert torch.equal(run(), want), name


def test_every_variant_but_the_library_edits_a_kernel_and_puts_it_back(tmp_path):
    library = {k: getattr(fused, k) for k in (probe.GEMV, probe.PROJ)}
    for name, edits in probe.VARIANTS.items():
        assert (name == "library") == (not edits)
        kernels = probe.variant_kernels(name, tmp_path)  # each edit finds its line once
        with kernels_in_place(kernels):
            for k, kernel in kernels.items():
                assert getattr(fused, k) is kernel and kernel is not library[k]
        assert {k: getattr(fused, k) for k in library} == library

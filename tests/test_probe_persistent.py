"""tools/probe_persistent.py: the MLPs of every layer at batch 1 as one persistent kernel (issue
14's next step, not in the library). Its phases against PyTorch's MLPs and against the library's
GEMV chain; without CUDA under Triton's CPU interpreter, one launch per phase (a grid-wide barrier
spins: the interpreter runs one program at a time), and on a GPU as one launch with barriers."""
import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")

import fastgen_lib as fg  # noqa: E402
from fastgen_lib import fused  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_persistent",
                                              ROOT / "tools" / "probe_persistent.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def chain(model):
    """h [1, E], the MLPs, and PyTorch's answer: h + mlp(ln_2(h)), layer after layer (in the
    model's dtype)."""
    torch.manual_seed(0)
    E = model.config.n_embd
    h = (torch.randn(1, E, device=DEVICE) * 2 + 0.5).to(model.dtype)
    want = h.clone()
    with torch.no_grad():
        for b in model.transformer.h:
            want = want + b.mlp(b.ln_2(want))
    return h, probe.MLPs(model), want


@pytest.mark.parametrize("cfg", [{}, dict(block_n1=16, block_n2=16, block_k=32),
                                 dict(programs=3)])
def test_persistent_mlps_phase_by_phase(cfg):
    # one launch per phase, 4 programs (the interpreter's SM count) or 3: each takes several
    # column tiles of every GEMV; the same answer as PyTorch's and as the library's GEMVs
    model = fg.load_model("tiny", device=DEVICE)
    h, mlps, want = chain(model)
    m = torch.empty(1, mlps.F, device=DEVICE)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    got = probe.persistent_mlps(mlps, h.clone(), m, cnt, phases=1, **cfg)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    scratch = fused.Buffers(model, 1, 16).scratch
    torch.testing.assert_close(got, probe.gemv_mlps(mlps, h.clone(), m, scratch), rtol=1e-5,
                               atol=1e-6)
    assert not cnt.any()  # the last program out reset the counters


@pytest.mark.gpu  # the barrier spins: GPU only (tests/conftest.py skips it without CUDA)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_persistent_mlps_in_one_launch(dtype):
    model = fg.load_model("124m", device=DEVICE, dtype=dtype)
    h, mlps, want = chain(model)
    m = torch.empty(1, mlps.F, device=DEVICE, dtype=dtype)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    by_phase = probe.persistent_mlps(mlps, h.clone(), m, cnt, phases=1)
    for _ in range(2):  # twice: the counters were reset
        one = probe.persistent_mlps(mlps, h.clone(), m, cnt)
        torch.testing.assert_close(one, by_phase, rtol=0, atol=0)  # the same sums, in order
    assert not cnt.any()
    if dtype == torch.float32:
        torch.testing.assert_close(one, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [dict(block_n=16, block_k=16, k_chunk1=16, k_chunk2=32),
                                 dict(block_n=32, block_k=32, k_chunk1=32, k_chunk2=64,
                                      programs=3),
                                 dict(block_n=32, block_k=32, programs=3, prefetch=False)])
def test_splitk_mlps_phase_by_phase(cfg):
    # each GEMV split along K (4 and 8 chunks, or 2 and 4, or 1 and 1), its partials added by
    # the phase after, the first tile of W read before the barrier or not; one launch per
    # phase: PyTorch's answer, and the library's GEMVs'
    model = fg.load_model("tiny", device=DEVICE)
    h, mlps, want = chain(model)
    hb = torch.full((probe.splitk_floats(mlps, **cfg),), float("nan"), device=DEVICE)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    got = probe.splitk_mlps(mlps, h.clone(), hb, cnt, phases=1, **cfg)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    scratch = fused.Buffers(model, 1, 16).scratch
    m = torch.empty(1, mlps.F, device=DEVICE)
    torch.testing.assert_close(got, probe.gemv_mlps(mlps, h.clone(), m, scratch), rtol=1e-5,
                               atol=1e-5)
    assert not cnt.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_splitk_mlps_in_one_launch(dtype):
    model = fg.load_model("124m", device=DEVICE, dtype=dtype)
    h, mlps, want = chain(model)
    hb = torch.zeros(probe.splitk_floats(mlps), device=DEVICE)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    by_phase = probe.splitk_mlps(mlps, h.clone(), hb, cnt, phases=1)
    for _ in range(2):  # twice: the counters were reset
        one = probe.splitk_mlps(mlps, h.clone(), hb, cnt, cooperative=True)
        torch.testing.assert_close(one, by_phase, rtol=0, atol=0)
    assert not cnt.any()
    if dtype == torch.float32:
        torch.testing.assert_close(one, want, rtol=1e-4, atol=1e-4)

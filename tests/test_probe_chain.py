"""tools/probe_chain.py: the fused kernels' skeleton without weights (chapter 9's "What holds the
rest", results/h200/fused/chain/). Its hand-off kernels pass x along, each adding 1, so that a
chain's time is the time of a correct chain; the split's last program must see every partial.
Without CUDA they run under Triton's CPU interpreter (tests/conftest.py). The barrier kernel is
GPU only (the interpreter runs one program at a time: the first would spin forever)."""
import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the fused kernels need it")

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_chain", ROOT / "tools" / "probe_chain.py")
probe_chain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_chain)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("tiles, split", [(1, 1), (12, 12), (48, 6)])
def test_handoff_chain_adds_one_per_kernel(tiles, split):
    n = 3
    run, x, y = probe_chain.handoff_chain(n, tiles, split, False, DEVICE)
    x.fill_(0.5)
    run()
    got = y if n % 2 else x  # the last kernel's output
    assert torch.equal(got, torch.full_like(got, 0.5 + n)), got[:4]
    # and again: the counters were reset by each tile's last program
    x.fill_(0.5)
    run()
    assert torch.equal(got, torch.full_like(got, 0.5 + n)), got[:4]


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("programs", [1, 144])
def test_whole_chain_adds_one_per_kernel(programs, flag):
    # each kernel reads all of x; with flag=True it waits on the count of the kernel ahead
    # (every one of its programs adds 1), zeroed at the start of each run: twice, the same
    n = 3
    run, x, y = probe_chain.whole_chain(n, programs, flag, DEVICE)
    for _ in range(2):
        x.fill_(0.5)
        run()
        got = y if n % 2 else x
        assert torch.equal(got, torch.full_like(got, 0.5 + n)), got[:4]


@pytest.mark.gpu  # the grid barrier spins: GPU only (tests/conftest.py skips it without CUDA)
def test_barrier_chain_adds_one_per_phase():
    for n in (1, 4):
        run, x, y = probe_chain.barrier_chain(n, DEVICE)
        run()
        torch.cuda.synchronize()
        got = y if n % 2 else x
        assert torch.equal(got, torch.full_like(got, float(n)))

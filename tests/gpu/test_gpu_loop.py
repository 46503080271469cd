"""The gpu_loop decoder (fastgen_lib/gpu_loop.py) on the H200: one graph launch per generation gives
the tokens of `fused` (the same step, stopped by the host), with rows that never stop, stop apart, or
all stop early: no step runs after the last row has finished, and none is missing."""
import pytest
import torch

import fastgen_lib as fg
from fastgen_lib.models import EOS

pytestmark = pytest.mark.gpu
pytest.importorskip("cuda.bindings", reason="gpu_loop needs NVIDIA's CUDA Python bindings")


@pytest.fixture(scope="module")
def model():
    return fg.load_model("124m", device="cuda", weights="random")


@pytest.mark.parametrize("bias", [0.0, 2.0, 3.0])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_gpu_loop_gives_fuseds_tokens(model, batch, bias):
    fg.set_eos_bias(model, bias)
    ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
    kw = dict(max_new_tokens=60, eos_token_id=EOS, pad_token_id=EOS)
    want = fg.generate(model, ids, mask, decoder="fused", **kw)
    got = fg.generate(model, ids, mask, decoder="gpu_loop", **kw)
    fg.set_eos_bias(model, 0.0)
    assert torch.equal(got, want), (got.shape, want.shape)


def test_gpu_loop_captures_its_body_on_a_stream_of_its_own(model):
    # torch.cuda.Stream() comes round-robin from a pool of 32: a body captured on one would, once
    # in 32 loops, be captured on the stream that torch.cuda.graph is capturing on (an illegal
    # state). 33 loops in a row, each on the same step, then a call that must still be right.
    from fastgen_lib.fused import FusedStep
    from fastgen_lib.gpu_loop import Loop
    ids, mask = fg.make_batch(1, 16, seed=1, device="cuda")
    kw = dict(max_new_tokens=8, eos_token_id=EOS, pad_token_id=EOS)
    want = fg.generate(model, ids, mask, decoder="fused", **kw)
    fg.generate(model, ids, mask, decoder="gpu_loop", **kw)
    step = next(s for s in model._fastgen_steps.values() if isinstance(s, FusedStep))
    for _ in range(33):
        step._gpu_loop = Loop(step)
    assert torch.equal(fg.generate(model, ids, mask, decoder="gpu_loop", **kw), want)

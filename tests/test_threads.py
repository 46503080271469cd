"""Calls on one model from several threads give the serial call's tokens, on every decoder this
machine runs (`decoders.lock`: the calls queue). The GPU's: tests/gpu/test_gpu_threads.py."""
import importlib.util

import pytest
import torch

import fastgen_lib as fg
from fastgen_lib.models import EOS

HAS_TRITON = importlib.util.find_spec("triton") is not None
# two threads with one shape (the compiled decoders' kept step is shared), two with others
SHAPES = [(2, 6), (2, 6), (3, 4), (1, 9)]
CPU_DECODERS = [d for d in fg.DECODERS if d not in ("fused", "gpu_loop")]


@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_threads_on_one_model_give_the_serial_tokens(decoder, run_threads):
    model = fg.load_model("tiny", device="cpu")
    fg.set_eos_bias(model, 0.7)  # rows stop apart
    batches = [fg.make_batch(b, t, mixed=True, seed=i) for i, (b, t) in enumerate(SHAPES)]
    kw = dict(decoder=decoder, max_new_tokens=12, eos_token_id=EOS, pad_token_id=EOS)
    want = [fg.generate(model, ids, mask, **kw) for ids, mask in batches]
    got, errors = run_threads(model, batches, rounds=2, **kw)
    assert not errors, errors
    for i, outs in got.items():
        assert len(outs) == 2 and all(torch.equal(o, want[i]) for o in outs), (decoder, i)


@pytest.mark.skipif(not HAS_TRITON, reason="fused needs Triton (its CPU interpreter here)")
def test_fused_threads_give_the_serial_tokens(run_threads):
    # under Triton's interpreter a step takes seconds: two threads, one shape, 3 tokens
    model = fg.load_model("tiny", device="cpu")
    batches = [fg.make_batch(1, 5, seed=0)] * 2
    kw = dict(decoder="fused", max_new_tokens=3, eos_token_id=EOS, pad_token_id=EOS)
    want = fg.generate(model, *batches[0], **kw)
    got, errors = run_threads(model, batches, rounds=1, **kw)
    assert not errors, errors
    assert all(torch.equal(o, want) for outs in got.values() for o in outs)


"""Calls on one model from several threads on the H200 give the serial call's tokens, on every
decoder (`decoders.lock`): the CPU's test is tests/test_threads.py."""
import pytest
import torch

import fastgen_lib as fg
from fastgen_lib.models import EOS

pytestmark = pytest.mark.gpu
SHAPES = [(2, 6), (2, 6), (3, 4), (1, 9)]  # two threads with one shape, two with others
@pytest.mark.parametrize("decoder", list(fg.DECODERS))
def test_threads_on_the_gpu_give_the_serial_tokens(decoder, run_threads):
    # GPT-2 124M on CUDA: the compiled decoders' graphs and streams, fused and gpu_loop included
    if decoder == "gpu_loop":
        pytest.importorskip("cuda.bindings", reason="gpu_loop needs cuda-bindings")
    model = fg.load_model("124m", device="cuda", weights="random")
    fg.set_eos_bias(model, 2.0)  # rows stop apart
    batches = [fg.make_batch(b, t, mixed=True, seed=i, device="cuda")
               for i, (b, t) in enumerate(SHAPES)]
    kw = dict(decoder=decoder, max_new_tokens=24, eos_token_id=EOS, pad_token_id=EOS)
    want = [fg.generate(model, ids, mask, **kw) for ids, mask in batches]
    got, errors = run_threads(model, batches, rounds=3, **kw)
    assert not errors, errors
    for i, outs in got.items():
        assert all(torch.equal(o, want[i]) for o in outs), (decoder, i)

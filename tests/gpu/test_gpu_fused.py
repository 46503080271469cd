"""The fused Triton step (fastgen_lib/fused/) on the H200: FusedStep, captured as CUDA graphs and driven
by every stop driver, gives `compiled`'s tokens on GPT-2 124M in float32 (mixed-length left padding, rows
stopping apart), or parts from them only at a near-tie, shown with its top-2 logit gap."""
import pytest
import torch

import fastgen_lib as fg
from fastgen_lib import decoders, stops
from fastgen_lib.models import EOS
from fastgen_lib.reference import first_divergence
from fastgen_lib.steps import GenConfig, GraphStep

pytestmark = pytest.mark.gpu
fused = pytest.importorskip("fastgen_lib.fused")


@pytest.fixture(scope="module")
def model():
    m = fg.load_model("124m", device="cuda", weights="random")
    return m


@pytest.mark.parametrize("bias", [0.0, 2.0, 3.0])  # no stop, rows stopping apart, all at once
@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("driver", ["every_step", "deferred", "interleaved"])
def test_fused_step_gives_compileds_tokens(model, driver, batch, bias):
    fg.set_eos_bias(model, bias)
    ids, mask = fg.make_batch(batch, 16, mixed=True, seed=batch, device="cuda")
    gen = GenConfig(40, (EOS,), EOS, False, 1.0, None, 0, None, "one_query")
    with torch.inference_mode():
        want = decoders.decode(model, ids, mask, gen, GraphStep, stops.every_step)
        got = decoders.decode(model, ids, mask, gen, fused.FusedStep, getattr(stops, driver))
    d = first_divergence(model, ids, mask, want, got)
    assert d is None or d.get("top2_gap", 1.0) < 1e-4, d


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_step_with_pdl_equals_without(dtype):
    # on a GPU that has them (Hopper on), FusedStep launches its kernels as programmatic dependent
    # launches: the same kernels in the same order, so the same tokens to the bit as without
    class NoPDL(fused.FusedStep):
        pdl = False

    m = fg.load_model("124m", device="cuda", dtype=dtype, weights="random")
    fg.set_eos_bias(m, 2.0)  # rows stopping apart
    assert fused.supports_pdl(m.device)
    ids, mask = fg.make_batch(8, 16, mixed=True, seed=8, device="cuda")
    gen = GenConfig(60, (EOS,), EOS)
    with torch.inference_mode():
        got = decoders.decode(m, ids, mask, gen, fused.FusedStep, stops.interleaved)
        want = decoders.decode(m, ids, mask, gen, NoPDL, stops.interleaved)
    assert m.__dict__["_fastgen_steps"] and all(
        s.pdl for s in m.__dict__["_fastgen_steps"].values() if type(s) is fused.FusedStep)
    assert torch.equal(got, want)

"""Correctness on the CPU with the tiny GPT-2: every decoder returns exactly `model.generate`'s tokens."""
import importlib.util

import pytest
import torch

import fastgen_lib as fg
from fastgen_lib.reference import HF_REFERENCE, first_divergence, hf_generate
from fastgen_lib.models import EOS

# `fused` runs its Triton kernels under Triton's CPU interpreter here (tests/conftest.py)
HAS_TRITON = importlib.util.find_spec("triton") is not None
# `gpu_loop` needs a CUDA GPU (conditional graph nodes): tests/gpu/test_gpu_loop.py
DECODERS = [pytest.param(d, marks=pytest.mark.skip(reason="fused needs Triton"))
            if d == "fused" and not HAS_TRITON else
            pytest.param(d, marks=pytest.mark.skip(reason="gpu_loop needs a CUDA GPU"))
            if d == "gpu_loop" else d for d in fg.DECODERS]

# name: (batch, prompt_len, new tokens, mixed-length prompts, EOS bias)
CASES = {
    "batch1": (1, 8, 24, False, 0.0),
    "batch4_mixed": (4, 12, 40, True, 0.0),
    "batch8_stops": (8, 16, 100, True, 0.7),   # rows finish at different steps, some never
    "all_stop_early": (3, 10, 60, True, 1.5),  # every row finishes: the output is shorter than T+N
}


def skip_slow_fused(decoder, case):
    """`fused` under Triton's CPU interpreter takes about 3 s a step at batch > 1: batch8_stops'
    100 steps would take 6 minutes a test. Its rows stopping apart are checked on the CPU by
    tests/test_fused.py (every stop driver, batch 4, mixed padding) and on the GPU by
    tests/gpu/test_gpu_decoders.py (b8_stops, b32_stops)."""
    if decoder == "fused" and case == "batch8_stops":
        pytest.skip("fused under the interpreter: tests/test_fused.py and the GPU tests")


@pytest.fixture(scope="module")
def model():
    return fg.load_model("tiny", device="cpu")


def workload(model, case):
    B, T, N, mixed, bias = CASES[case]
    fg.set_eos_bias(model, bias)
    ids, mask = fg.make_batch(B, T, mixed=mixed, seed=B + T)
    return ids, mask, N


@pytest.fixture(scope="module")
def references(model):
    refs = {}
    for case in CASES:
        ids, mask, N = workload(model, case)
        for kind in ("use_cache", "dynamic", "static"):
            kwargs = {"use_cache": dict(use_cache=False), "dynamic": {},
                      "static": dict(cache_implementation="static")}[kind]
            refs[case, kind] = hf_generate(model, ids, mask, N, EOS, EOS, **kwargs)
    return refs


def _kind(decoder):
    kw = HF_REFERENCE[decoder]
    return "use_cache" if "use_cache" in kw else "static" if kw else "dynamic"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("decoder", DECODERS)
def test_matches_model_generate(model, references, decoder, case):
    skip_slow_fused(decoder, case)
    ids, mask, N = workload(model, case)
    ref = references[case, _kind(decoder)]
    out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=N, eos_token_id=EOS, pad_token_id=EOS)
    assert first_divergence(model, ids, mask, ref, out) is None


@pytest.mark.parametrize("decoder", DECODERS)
def test_one_two_three_new_tokens_then_a_normal_call(model, decoder):
    # the compiled decoders' warm-up runs three steps: never past a request of 1-3 new tokens
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(3, 5, seed=3)
    for n in (1, 2, 3, 12):
        ref = hf_generate(model, ids, mask, n, EOS, EOS, **HF_REFERENCE[decoder])
        out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=n, eos_token_id=EOS,
                          pad_token_id=EOS)
        assert first_divergence(model, ids, mask, ref, out) is None, n


@pytest.mark.parametrize("decoder", ["static_cache", "compiled", "interleaved"])
def test_a_longer_cache_gives_the_same_tokens(model, decoder):
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(2, 8, seed=4)
    ref = hf_generate(model, ids, mask, 10, EOS, EOS)
    out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=10, max_cache_len=96)
    assert first_divergence(model, ids, mask, ref, out) is None


def test_cases_really_stop_at_different_steps(model, references):
    # the workloads above exercise early stopping: in batch8_stops rows end at >= 2 different steps
    # while others run to the end; in all_stop_early the whole batch ends before max_new_tokens
    ids, mask, N = workload(model, "batch8_stops")
    gen = references["batch8_stops", "dynamic"][:, ids.shape[1]:]
    stops = {int((row == EOS).nonzero()[0]) for row in gen if (row == EOS).any()}
    assert len(stops) >= 2 and gen.shape[1] == N and not all((row == EOS).any() for row in gen)
    ids, mask, N = workload(model, "all_stop_early")
    assert references["all_stop_early", "dynamic"].shape[1] < ids.shape[1] + N


def test_eager_decoders_agree_with_each_other_and_generate(references):
    # the three generate() flavours agree here, so "like with like" is not hiding a disagreement
    for case in CASES:
        a, b, c = (references[case, k] for k in ("use_cache", "dynamic", "static"))
        assert torch.equal(a, b) and torch.equal(b, c)


@pytest.mark.parametrize("decoder", DECODERS)
def test_sampling_is_reproducible_with_a_seed(model, decoder):
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(3, 8, seed=5)
    kw = dict(decoder=decoder, max_new_tokens=12, do_sample=True, temperature=0.8, top_k=50)
    a = fg.generate(model, ids, mask, seed=123, **kw)
    b = fg.generate(model, ids, mask, seed=123, **kw)
    c = fg.generate(model, ids, mask, seed=124, **kw)
    greedy = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, greedy)


def test_sampling_same_tokens_across_decoders(model):
    # counter-based Gumbel noise: the same seed draws the same numbers in every decoder
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(2, 6, seed=9)
    outs = {d: fg.generate(model, ids, mask, decoder=d, max_new_tokens=10, do_sample=True, seed=7)
            for d in fg.DECODERS if (d != "fused" or HAS_TRITON) and d != "gpu_loop"}
    for d, out in outs.items():
        assert torch.equal(out, outs["kv_cache"]), d


def test_seed_none_follows_torch_manual_seed(model):
    ids, mask = fg.make_batch(1, 4)
    torch.manual_seed(0)
    a = fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=8, do_sample=True)
    torch.manual_seed(0)
    b = fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=8, do_sample=True)
    assert torch.equal(a, b)


def test_gumbel_sampling_draws_from_softmax():
    # argmax(logits + Gumbel) ~ softmax(logits): frequencies over 20,000 rows within 3 sigma
    from fastgen_lib.steps import Chooser, GenConfig, choose
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    c = Chooser(GenConfig(1, None, 0, do_sample=True, seed=11), "cpu")
    tok = choose(logits, torch.zeros(20000, dtype=torch.bool), torch.tensor(3), c)
    freq = torch.bincount(tok, minlength=4).float() / 20000
    p = torch.softmax(logits[0], -1)
    assert torch.all((freq - p).abs() < 3 * (p * (1 - p) / 20000).sqrt() + 1e-3)


def test_top_k_only_picks_the_k_largest():
    from fastgen_lib.steps import Chooser, GenConfig, choose
    logits = torch.randn(500, 100)
    c = Chooser(GenConfig(1, None, 0, do_sample=True, temperature=5.0, top_k=3, seed=1), "cpu")
    tok = choose(logits, torch.zeros(500, dtype=torch.bool), torch.tensor(0), c)
    top3 = logits.topk(3).indices
    assert (top3 == tok[:, None]).any(-1).all()


def graph_steps(model, batch, length):
    """The GraphSteps kept on `model` for this batch size and cache length."""
    return [s for k, s in model.__dict__.get("_fastgen_steps", {}).items() if k[2:4] == (batch, length)]


def test_graph_step_buffers_are_reused(model):
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(2, 6, seed=1)
    fg.generate(model, ids, mask, decoder="interleaved", max_new_tokens=9)
    (step,) = graph_steps(model, 2, 15)
    ptrs = (step.out.data_ptr(), step.chooser.seed.data_ptr(), step.cache.layers[0].keys.data_ptr())
    ids2, mask2 = fg.make_batch(2, 6, seed=2)
    fg.generate(model, ids2, mask2, decoder="compiled", max_new_tokens=9, seed=5)  # another driver
    assert graph_steps(model, 2, 15) == [step]
    assert ptrs == (step.out.data_ptr(), step.chooser.seed.data_ptr(), step.cache.layers[0].keys.data_ptr())


def test_reset_frees_the_graph_steps_and_new_weights_replace_them(model):
    ids, mask = fg.make_batch(2, 6, seed=1)
    fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=9)
    assert fg.decoders.reset(model) >= 1 and graph_steps(model, 2, 15) == []
    fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=9)
    (old,) = graph_steps(model, 2, 15)
    with torch.no_grad():  # a weight updated in place: same address, the graphs read the new values
        model.transformer.ln_f.weight.mul_(1.0)
    fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=9)
    assert graph_steps(model, 2, 15) == [old]
    ln_f = model.transformer.ln_f  # a weight replaced by another tensor: the old graphs would read
    ln_f.weight = torch.nn.Parameter(ln_f.weight.clone(), requires_grad=False)  # freed memory
    out = fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=9)
    (new,) = graph_steps(model, 2, 15)
    assert new is not old and len(model._fastgen_steps) == 1  # the stale one is freed, not kept
    assert torch.equal(out, fg.generate(model, ids, mask, decoder="kv_cache", max_new_tokens=9))


def test_a_new_temperature_or_top_k_recompiles_nothing(model):
    # the per-call settings live in tensors (steps.Chooser): one compile, one GraphStep, any values
    from torch._dynamo.utils import counters
    ids, mask = fg.make_batch(2, 6, seed=3)
    kw = dict(decoder="compiled", max_new_tokens=9, do_sample=True)
    fg.generate(model, ids, mask, temperature=0.5, top_k=3, seed=1, **kw)
    frames, kept = counters["stats"]["unique_graphs"], len(model._fastgen_steps)
    for t, k, seed in [(2.0, 7, 2), (0.9, 40, 3), (1.0, 1, 4)]:
        out = fg.generate(model, ids, mask, temperature=t, top_k=k, seed=seed, **kw)
        ref = fg.generate(model, ids, mask, temperature=t, top_k=k, seed=seed,
                          **{**kw, "decoder": "kv_cache"})
        assert torch.equal(out, ref)
    assert counters["stats"]["unique_graphs"] == frames and len(model._fastgen_steps) == kept


def test_every_step_backend_with_every_stop_driver_gives_generate_tokens(model, references):
    from fastgen_lib import steps, stops
    ids, mask, N = workload(model, "batch4_mixed")
    gen = fg.decoders.GenConfig(N, EOS, EOS)
    for backend in (steps.NaiveStep, steps.DynamicStep, steps.StaticStep, steps.GraphStep):
        for driver in (stops.every_step, stops.deferred, stops.interleaved):
            with torch.inference_mode():
                out = fg.decoders.decode(model, ids, mask, gen, backend, driver)
            ref = references["batch4_mixed", "static" if backend is steps.StaticStep else "dynamic"]
            assert first_divergence(model, ids, mask, ref, out) is None, (backend, driver)


def test_returns_generate_shape_for_a_real_prompt(model):
    tok = fg.load_tokenizer()
    ids, mask = fg.make_batch(3, tokenizer=tok)
    out = fg.generate(model, ids, mask, decoder="interleaved", max_new_tokens=5)
    assert out.shape == (3, ids.shape[1] + 5) and torch.equal(out[:, : ids.shape[1]], ids)
    assert isinstance(tok.batch_decode(out[:, ids.shape[1]:]), list)


def test_one_query_attention_matches_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from fastgen_lib.steps import one_query_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (1, 10, 10))
    mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :4] = False   # a left-padded row
    mask[:, ..., 7:] = False   # cache slots not written yet
    layer = torch.nn.Module()  # sdpa_attention_forward reads `is_causal` off the module
    layer.is_causal = True
    want, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
    got, weights = one_query_attention(layer, q, k, v, mask, scaling=0.3)
    assert got.shape == want.shape == (2, 1, 3, 8) and weights is None
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("choice", ["auto", "one_query", "sdpa", "math"])
def test_decode_attention_choices_give_generate_tokens(model, references, choice):
    ids, mask, N = workload(model, "batch4_mixed")
    want = "one_query" if choice == "auto" else choice  # the tiny model is float32
    with fg.steps.decode_attention(model, want):
        assert model.config._attn_implementation == fg.steps.ATTENTION[want]
    assert model.config._attn_implementation == "sdpa"  # switched back: model.generate never sees ours
    out = fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=N, decode_attention=choice)
    assert first_divergence(model, ids, mask, references["batch4_mixed", "dynamic"], out) is None
    kept = graph_steps(model, ids.shape[0], ids.shape[1] + N)
    assert want in {s.attention for s in kept}  # a GraphStep per attention: each has its own graphs


def test_auto_attention_is_one_query_only_in_float32():
    choice = fg.steps.attention_choice
    assert (choice(torch.float32), choice(torch.bfloat16), choice(torch.float16)) == ("one_query", "sdpa", "sdpa")


def test_decode_attention_rejects_an_unknown_choice(model):
    ids, mask = fg.make_batch(1, 4, seed=0)
    with pytest.raises(ValueError, match="decode_attention='flash'"):
        fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=3, decode_attention="flash")


class Recorder:
    """A streamer (transformers' protocol: `put`, then `end`) that keeps what it was given."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        assert value.device.type == "cpu"
        self.puts.append(value.clone())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("case", ["batch8_stops", "all_stop_early", "batch1"])
@pytest.mark.parametrize("decoder", DECODERS)
def test_a_streamer_gets_what_model_generate_gives_it(model, decoder, case):
    # the prompt, then every new token [B] in order (pads for finished rows), then end(), once
    skip_slow_fused(decoder, case)
    ids, mask, N = workload(model, case)
    want, got = Recorder(), Recorder()
    ref = hf_generate(model, ids, mask, N, EOS, EOS, streamer=want)
    out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=N, eos_token_id=EOS,
                      pad_token_id=EOS, streamer=got)
    assert torch.equal(out, ref) and got.ended == want.ended == 1
    assert len(got.puts) == len(want.puts) == 1 + ref.shape[1] - ids.shape[1]
    for a, b in zip(got.puts, want.puts):
        assert torch.equal(a, b)
    assert torch.equal(torch.stack(got.puts[1:], 1), out[:, ids.shape[1]:])


def test_text_streamer_prints_the_new_text(model, capsys):
    from transformers import TextStreamer
    tok = fg.load_tokenizer("124m")
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(1, 6, seed=1)
    out = fg.generate(model, ids, mask, decoder="interleaved", max_new_tokens=12,
                      streamer=TextStreamer(tok, skip_prompt=True))
    assert capsys.readouterr().out.strip() == tok.decode(out[0, 6:]).strip()


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_streamer_with_one_two_three_new_tokens(model, decoder):
    # the drivers' last put (after the loop) and their first (the prefill's token) at the edges
    fg.set_eos_bias(model, 0.0)
    ids, mask = fg.make_batch(3, 5, seed=3)
    for n in (1, 2, 3):
        want, got = Recorder(), Recorder()
        ref = hf_generate(model, ids, mask, n, EOS, EOS, streamer=want)
        out = fg.generate(model, ids, mask, decoder=decoder, max_new_tokens=n, eos_token_id=EOS,
                          pad_token_id=EOS, streamer=got)
        assert torch.equal(out, ref) and len(got.puts) == len(want.puts) == 1 + n
        assert all(torch.equal(a, b) for a, b in zip(got.puts, want.puts)) and got.ended == 1

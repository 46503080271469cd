"""Property-based tests (hypothesis) on the CPU with the tiny GPT-2, for every decoder in `DECODERS`.

Valid input (batch 1-9, prompt 1-32, 1-64 new tokens, random left padding, an EOS logit bias that stops rows
at different steps, eos/pad choices, cache lengths): under greedy decoding every decoder returns exactly
the tokens of its `HF_REFERENCE` `model.generate` call; sampling with one seed gives the same tokens on
every decoder, and with top_k=k only ever picks one of the k largest logits; a call with 1-3 new tokens
followed by a normal one works; integer-like arguments (numpy, 0-d tensors) give the same tokens as ints.
Bad input: a ValueError or TypeError that names the argument, raised before any state is touched (torch's
RNG, the compiled runners, the model's mode); the next valid call is correct.

Runtime: the compiled decoders (compiled, deferred, interleaved) compile one step per variant (greedy or
sampling, top-k or not, batch 1 or more); sizes are dynamic, so most new shapes reuse a compile. The EOS
bias is set in place on a bias vector installed once (`fg.set_eos_bias` would drop the runners and force
new compiles). derandomize=True: CI draws the same examples every run.
"""
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from transformers import StaticCache

import fastgen_lib as fg
from fastgen_lib.reference import HF_REFERENCE, first_divergence, hf_generate
from fastgen_lib.models import EOS

DECODERS = [d for d in fg.DECODERS if d not in ("fused", "gpu_loop")]  # Triton's interpreter: too slow for
# hypothesis's many examples; tests/test_decoders.py runs fused on the same properties
VOCAB, N_POS = 50257, 1024


def hsettings(max_examples):
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def model():
    m = fg.load_model("tiny", device="cpu")
    fg.set_eos_bias(m, 1.0)  # installs lm_head.bias once; examples set its values in place (set_bias)
    set_bias(m, EOS, 0.0)
    return m


def set_bias(model, token, value):
    """`value` on `token`'s logit, 0 elsewhere, in place: the compiled runners keep their compiles."""
    with torch.no_grad():
        model.lm_head.bias.zero_()
        model.lm_head.bias[token] = value


def resolved(model, eos, pad):
    """The ids `fg.generate` uses for eos/pad None (the model's generation config), i.e. what
    `model.generate` uses when the argument is left out. (hf_generate passes both explicitly, and
    `model.generate(eos_token_id=None)` means "never stop", not "the default".)"""
    gc = model.generation_config
    eos = gc.eos_token_id if eos is None else eos
    if pad is None:
        pad = gc.pad_token_id if gc.pad_token_id is not None else eos if eos is not None else 0
    return eos, pad


# --- drawing valid input ---------------------------------------------------------------------------------

@st.composite
def batches(draw, batch=st.integers(1, 9), max_prompt=32):
    """input_ids [B, T] and a left-padding mask: each row has 0..T-1 leading pads, its last token is real."""
    B = draw(batch, label="batch")
    T = draw(st.integers(1, max_prompt), label="prompt_len")
    pads = draw(st.lists(st.integers(0, T - 1), min_size=B, max_size=B), label="pads per row")
    seed = draw(st.integers(0, 2**16), label="ids seed")
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, T, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    return ids, mask


token_ids = st.one_of(st.none(), st.just(EOS), st.integers(0, VOCAB - 1))
new_tokens = st.one_of(st.integers(1, 3), st.integers(1, 64))       # 1-3 often: the compiled edge cases
eos_bias = st.sampled_from([0.0, 0.5, 0.8, 1.0, 1.2, 1.5])         # > 0: rows stop at different steps


@dataclass
class Case:
    ids: torch.Tensor
    mask: torch.Tensor
    max_new_tokens: int
    eos_token_id: int | None
    pad_token_id: int | None
    bias: float
    extra_cache: int | None  # max_cache_len = T + N + extra_cache (None: the default)

    @property
    def max_cache_len(self):
        return None if self.extra_cache is None else self.ids.shape[1] + self.max_new_tokens + self.extra_cache

    def kwargs(self):
        return dict(max_new_tokens=self.max_new_tokens, eos_token_id=self.eos_token_id,
                    pad_token_id=self.pad_token_id, max_cache_len=self.max_cache_len)


@st.composite
def cases(draw, batch=st.integers(1, 9), new=new_tokens):
    ids, mask = draw(batches(batch))
    return Case(ids, mask, draw(new, label="max_new_tokens"), draw(token_ids, label="eos_token_id"),
                draw(token_ids, label="pad_token_id"), draw(eos_bias, label="eos bias"),
                draw(st.one_of(st.none(), st.integers(0, 40)), label="extra cache slots"))


def prepare(model, case):
    """Put the case's bias on the logit of the EOS id in effect; return (eos, pad) as fg.generate resolves them."""
    eos, pad = resolved(model, case.eos_token_id, case.pad_token_id)
    set_bias(model, eos, case.bias)
    note(f"B={case.ids.shape[0]} T={case.ids.shape[1]} N={case.max_new_tokens} eos={case.eos_token_id}->{eos} "
         f"pad={case.pad_token_id}->{pad} bias={case.bias} max_cache_len={case.max_cache_len} "
         f"mask row sums={case.mask.sum(1).tolist()}")
    return eos, pad


_REFS = {}


def reference(model, case, decoder):
    """`model.generate`'s tokens for this case, the call HF_REFERENCE names for `decoder` (a static cache of
    `max_cache_len` slots for static_cache when one is given). Cached: the decoders of an example share it."""
    eos, pad = resolved(model, case.eos_token_id, case.pad_token_id)
    kw = dict(HF_REFERENCE[decoder])
    L = case.max_cache_len if kw.get("cache_implementation") == "static" else None
    key = (case.ids.numpy().tobytes(), case.mask.numpy().tobytes(), tuple(case.ids.shape), case.max_new_tokens,
           eos, pad, case.bias, tuple(sorted(kw.items())), L)
    if key not in _REFS:
        set_bias(model, eos, case.bias)
        if L is not None:
            kw = dict(past_key_values=StaticCache(config=model.config, max_cache_len=L))
        _REFS[key] = hf_generate(model, case.ids, case.mask, case.max_new_tokens, eos, pad, **kw)
    return _REFS[key]


def assert_matches_generate(model, case, decoder, out, what=None):
    ref = reference(model, case, decoder)
    div = first_divergence(model, case.ids, case.mask, ref, out)
    assert div is None, (f"{what or decoder} differs from greedy model.generate(**{HF_REFERENCE[decoder]}): {div} "
                         f"(out {tuple(out.shape)}, ref {tuple(ref.shape)})")


def assert_well_formed(out, ids, N, eos, pad):
    """[B, T+n], 1 <= n <= N, the prompt kept; a row is `pad` after its first EOS; n < N only if all stopped."""
    B, T = ids.shape
    assert out.shape[0] == B and T + 1 <= out.shape[1] <= T + N, (tuple(out.shape), T, N)
    assert torch.equal(out[:, :T], ids)
    new = out[:, T:]
    stopped = new == eos
    after = (stopped.long().cumsum(1) - stopped.long()) > 0  # strictly after the row's first EOS
    assert bool((new[after] == pad).all()), "a finished row got a token other than pad_token_id"
    if new.shape[1] < N:
        assert bool(stopped.any(1).all()), "stopped before max_new_tokens while a row was unfinished"


# --- 1. valid input --------------------------------------------------------------------------------------
# One example runs every decoder (they share its model.generate references and the compiled variants); a
# failure names each decoder that differs.

def check_all_decoders(model, case, **kw):
    """Every decoder on `case`; returns their outputs, or fails naming each one that crashed or differs
    from its HF_REFERENCE call (greedy) with `first_divergence`'s report."""
    eos, pad = prepare(model, case)
    outs, problems = {}, []
    for d in DECODERS:
        try:
            outs[d] = fg.generate(model, case.ids, case.mask, decoder=d, **case.kwargs(), **kw)
        except Exception as exc:  # report every decoder, not only the first
            problems.append(f"{d} raised {type(exc).__name__}: {exc}")
            continue
        if not kw.get("do_sample"):
            ref = reference(model, case, d)
            div = first_divergence(model, case.ids, case.mask, ref, outs[d])
            if div is not None:
                problems.append(f"{d} differs from greedy model.generate(**{HF_REFERENCE[d]}): {div} "
                                f"(out {tuple(outs[d].shape)}, ref {tuple(ref.shape)})")
    assert not problems, "\n".join(problems)
    for out in outs.values():
        assert_well_formed(out, case.ids, case.max_new_tokens, eos, pad)
    new = outs["naive"][:, case.ids.shape[1]:]
    event(f"batch {'1' if len(new) == 1 else '2-9'}, {'1-3' if case.max_new_tokens <= 3 else '4-64'} new tokens")
    event("all rows stopped early" if new.shape[1] < case.max_new_tokens else
          "some rows stopped early" if bool((new == eos).any()) else "no row stopped")
    return outs


@hsettings(max_examples=20)
@given(case=cases())
def test_greedy_every_decoder_matches_model_generate(model, case):
    check_all_decoders(model, case)


@hsettings(max_examples=10)
@given(case=cases(), temperature=st.floats(0.05, 20.0),
       top_k=st.one_of(st.none(), st.just(1), st.integers(2, VOCAB)), seed=st.integers(0, 2**32 - 1))
@example(case=Case(torch.tensor([[32487, 27591], [7093, 953]]), torch.ones(2, 2, dtype=torch.long), 1, None, None,
                   0.0, None), temperature=1.0, top_k=1, seed=2)  # the Gumbel noise of row 1, token 38630 is inf
def test_sampling_with_a_seed_is_the_same_on_every_decoder(model, case, temperature, top_k, seed):
    outs = check_all_decoders(model, case, do_sample=True, temperature=temperature, top_k=top_k, seed=seed)
    for d, out in outs.items():
        assert torch.equal(out, outs["naive"]), f"{d} samples other tokens than naive with seed {seed}"
    if top_k == 1:  # only the largest logit survives: sampling is greedy decoding
        assert_matches_generate(model, case, "kv_cache", outs["kv_cache"], "sampling with top_k=1 (kv_cache)")


@hsettings(max_examples=60)
@given(batch=st.integers(1, 9), k=st.integers(1, 20), temperature=st.floats(0.05, 20.0),
       seed=st.integers(0, 2**32 - 1), step=st.integers(0, N_POS))
@example(batch=2, k=1, temperature=1.0, seed=2, step=2)  # row 1 of this draw: token 38630's u rounds to 1.0
def test_sampling_only_picks_among_the_top_k(batch, k, temperature, seed, step):
    # `choose` at the real vocabulary size: argmax(logits / T + Gumbel) over the k largest logits must be one
    # of them, for every (seed, step, row). The Gumbel noise must be finite: u in (0, 1), never 0 or 1.
    from fastgen_lib.steps import Chooser, GenConfig, choose, gumbel_noise
    noise = gumbel_noise(torch.tensor(seed), torch.tensor(step), batch, VOCAB, "cpu")
    bad = (~torch.isfinite(noise)).nonzero().tolist()
    logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(seed % 1000))
    c = Chooser(GenConfig(1, None, 0, do_sample=True, temperature=temperature, top_k=k, seed=seed), "cpu")
    tok = choose(logits, torch.zeros(batch, dtype=torch.bool), torch.tensor(step), c)
    topk = logits.topk(k).indices
    outside = [(b, int(tok[b])) for b in range(batch) if int(tok[b]) not in topk[b].tolist()]
    assert not bad and not outside, (f"non-finite Gumbel noise at (row, token) {bad}; sampled (row, token) "
                                     f"outside the top {k}: {outside}")


@hsettings(max_examples=5)
@given(data=st.data())
def test_a_short_call_then_a_normal_call(model, data):
    # 1-3 new tokens first, on a model with no runners yet (as in a fresh process), then a normal call with
    # the same batch size: every decoder returns model.generate's tokens both times
    fg.decoders.reset(model)
    short = data.draw(cases(new=st.integers(1, 3)), label="short call")
    normal = data.draw(cases(batch=st.just(short.ids.shape[0]), new=st.integers(4, 64)), label="normal call")
    check_all_decoders(model, short)
    check_all_decoders(model, normal)


def as_int_like(draw, value, label):
    """`value` as a Python int, a numpy int or a 0-d integer tensor (what operator.index accepts)."""
    if value is None:
        return None
    kinds = [int, np.int64, torch.tensor]
    if -2**31 <= value < 2**31:
        kinds += [np.int32, lambda v: torch.tensor(v, dtype=torch.int32)]
    return draw(st.sampled_from(kinds), label=label)(value)


@hsettings(max_examples=12)
@given(data=st.data(), decoder=st.sampled_from(DECODERS))
def test_int_like_and_numpy_arguments_are_accepted(model, data, decoder):
    # numpy ints, 0-d integer tensors, numpy bools, numpy floats, 0/1 masks of other dtypes: the same tokens
    # as plain Python values; a greedy call accepts any finite temperature (only sampling uses it)
    ids, mask = fg.make_batch(2, 5, seed=3)
    N = data.draw(st.integers(1, 8), label="max_new_tokens")
    do_sample = data.draw(st.booleans(), label="do_sample")
    plain = dict(max_new_tokens=N, max_cache_len=data.draw(st.one_of(st.none(), st.integers(5 + N, N_POS))),
                 eos_token_id=data.draw(token_ids), pad_token_id=data.draw(token_ids),
                 top_k=data.draw(st.one_of(st.none(), st.just(1), st.integers(2, VOCAB))),
                 seed=data.draw(st.integers(0, 2**32 - 1)), do_sample=do_sample,
                 temperature=data.draw(st.floats(0.1, 5.0) if do_sample else st.floats(-5.0, 5.0)))
    eos, _ = resolved(model, plain["eos_token_id"], plain["pad_token_id"])
    set_bias(model, eos, 1.0)
    odd = {k: as_int_like(data.draw, v, k) for k, v in plain.items() if k not in ("do_sample", "temperature")}
    odd["do_sample"] = data.draw(st.sampled_from([bool, np.bool_]), label="do_sample type")(do_sample)
    odd["temperature"] = data.draw(st.sampled_from([float, np.float64, np.float32]), label="temperature type")(
        plain["temperature"])
    odd_mask = mask.to(data.draw(st.sampled_from([torch.long, torch.int32, torch.float32]), label="mask dtype"))
    note(f"plain={plain} odd={odd!r} mask dtype={odd_mask.dtype}")
    want = fg.generate(model, ids, mask, decoder=decoder, **plain)
    got = fg.generate(model, ids, odd_mask, decoder=decoder, **odd)
    assert torch.equal(got, want)
    if not do_sample:
        case = Case(ids, mask, N, plain["eos_token_id"], plain["pad_token_id"], 1.0,
                    None if plain["max_cache_len"] is None else plain["max_cache_len"] - 5 - N)
        assert_matches_generate(model, case, decoder, got)


# --- 2. bad input ----------------------------------------------------------------------------------------

OK_B, OK_T, OK_N = 2, 4, 5  # the valid call around each bad one
floats = st.floats(allow_nan=True, allow_infinity=True)
text = st.text(max_size=5)
int_like_wrappers = st.sampled_from([int, np.int64, torch.tensor])


def ints(lo=None, hi=None):
    """Integers in [lo, hi] as Python ints, numpy ints or 0-d tensors (out-of-range must fail in every form)."""
    base = st.integers(lo, hi)
    small = st.integers(max(lo, -2**62) if lo is not None else -2**62, min(hi, 2**62) if hi is not None else 2**62)
    return st.one_of(base, st.builds(lambda f, v: f(v), int_like_wrappers, small))


def not_ints():
    """Never an int: bools, floats (4.0 too), strings, float tensors, None-free."""
    return st.one_of(st.booleans(), st.sampled_from([np.bool_(True), 2.5, 4.0, np.float64(3.0), torch.tensor(2.0),
                                                     1j]), floats, text)


def bad_values():
    """(argument, extra kwargs, bad value, expected exception(s)); the message must name the argument."""
    T, N = OK_T, OK_N
    one = lambda name, values, exc, **extra: st.tuples(st.just(name), st.just(extra), values, st.just(exc))
    sampling = dict(do_sample=True)
    return st.one_of(
        one("max_new_tokens", ints(hi=0) | ints(lo=N_POS - T + 1), ValueError),
        one("max_new_tokens", not_ints() | st.none(), TypeError),
        one("max_cache_len", ints(hi=T + N - 1) | ints(lo=N_POS + 1), ValueError),
        one("max_cache_len", not_ints(), TypeError),
        one("eos_token_id", ints(hi=-1) | ints(lo=VOCAB), ValueError),
        one("eos_token_id", not_ints(), TypeError),
        one("pad_token_id", ints(hi=-1) | ints(lo=VOCAB), ValueError),
        one("pad_token_id", not_ints(), TypeError),
        one("top_k", ints(hi=0) | ints(lo=VOCAB + 1), ValueError),
        one("top_k", not_ints(), TypeError),
        one("top_k", ints(hi=0), ValueError, **sampling),
        one("seed", ints(hi=-1) | ints(lo=2**32), ValueError),
        one("seed", ints(hi=-1), ValueError, **sampling),
        one("seed", not_ints(), TypeError),
        one("do_sample", st.one_of(text, st.sampled_from(["False", "True", 0, 1, 1.0, None, np.int64(1),
                                                           torch.tensor(True)])), TypeError),
        one("temperature", st.one_of(text, st.booleans(), st.sampled_from(["1.0", None, 1j, np.bool_(True)])),
            TypeError),
        one("temperature", st.sampled_from([math.nan, math.inf, -math.inf]), ValueError),
        one("temperature", st.floats(max_value=0.0, allow_nan=False) | st.sampled_from([0, -1, np.float32(0)]),
            ValueError, **sampling),
        one("attention_mask", st.sampled_from(["float 0.5", "value 2", "value -1", "right padding", "hole",
                                               "all padding", "wrong shape", "other device"]), ValueError),
        one("attention_mask", st.just("a list"), (ValueError, TypeError)),
        one("decoder", text.filter(lambda s: s not in fg.DECODERS) | st.sampled_from(["Naive", " naive", "turbo"]),
            ValueError),
        one("decoder", st.sampled_from([None, 3, ("naive",), ["naive"]]), (ValueError, TypeError)),
        one("decode_attention", text.filter(lambda s: s not in ("auto", "one_query", "sdpa", "math"))
            | st.sampled_from(["flash", "SDPA", None, 3]), (ValueError, TypeError)),
        one("input_ids", st.sampled_from(["1-d", "float", "out of vocab", "negative", "empty", "a list"]),
            (ValueError, TypeError)),
        one("model.eval()", st.just("model.train()"), ValueError),
    )


def bad_mask(kind, ids):
    B, T = ids.shape
    m = torch.ones(B, T, dtype=torch.long)
    if kind == "float 0.5":
        m = m.float()
        m[0, 0] = 0.5
    elif kind == "value 2":
        m[1, 1] = 2
    elif kind == "value -1":
        m[0, 0] = -1
    elif kind == "right padding":
        m[1, -1] = 0
    elif kind == "hole":
        m[0, 1] = 0
    elif kind == "all padding":
        m[1] = 0
    elif kind == "wrong shape":
        m = m[:, 1:]
    elif kind == "other device":
        m = m.to("meta")
    elif kind == "a list":
        m = m.tolist()
    return m


def bad_ids(kind):
    return {"1-d": torch.tensor([1, 2, 3]), "float": torch.ones(OK_B, OK_T),
            "out of vocab": torch.full((1, 3), VOCAB), "negative": torch.tensor([[-1, 2]]),
            "empty": torch.zeros(1, 0, dtype=torch.long), "a list": [[1, 2, 3]]}[kind]


def state(model):
    kept = model.__dict__.get("_fastgen_steps", {})
    return (torch.get_rng_state(), [(k, id(r)) for k, r in kept.items()], model.training,
            model.config._attn_implementation, model.lm_head.bias.clone())


@hsettings(max_examples=300)
@given(bad=bad_values(), decoder=st.sampled_from(DECODERS), sample_context=st.booleans())
def test_bad_input_names_the_argument_and_touches_nothing(model, bad, decoder, sample_context):
    name, extra, value, exc = bad
    event(f"{name}: {exc.__name__ if isinstance(exc, type) else 'ValueError/TypeError'}")
    ids, mask = fg.make_batch(OK_B, OK_T, seed=1)
    # seed=None when sampling makes generate draw a seed from torch's RNG: it must not before the check
    kw = dict(decoder=decoder, max_new_tokens=OK_N, do_sample=sample_context, seed=None) | extra
    if name == "attention_mask":
        mask = bad_mask(value, ids)
    elif name == "input_ids":
        ids, mask = bad_ids(value), None
    elif name != "model.eval()":
        kw[name] = value
    set_bias(model, EOS, 1.0)
    before = state(model)
    if name == "model.eval()":
        model.train()
    try:
        with pytest.raises(exc) as err:
            fg.generate(model, ids, mask, **kw)
    finally:
        model.eval()
    assert name in str(err.value), f"the message does not name {name}: {err.value!r}"
    after = state(model)
    assert torch.equal(before[0], after[0]), "torch's global RNG state changed"
    assert before[1:4] == after[1:4], "runners, training mode or attention implementation changed"
    assert torch.equal(before[4], after[4])
    # the next valid call works and is correct
    case = Case(*fg.make_batch(OK_B, OK_T, seed=1), OK_N, None, None, 1.0, None)
    prepare(model, case)
    assert_matches_generate(model, case, decoder, fg.generate(model, case.ids, case.mask, decoder=decoder,
                                                              max_new_tokens=OK_N))

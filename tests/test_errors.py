"""Bad input gets a clear error, before any state is touched; the decoder works again right after."""
import os
import socket
import subprocess
import sys

import pytest
import torch

import fastgen_lib as fg
from fastgen_lib.models import prompts_for


@pytest.fixture(scope="module")
def model():
    return fg.load_model("tiny", device="cpu")


OK_IDS = torch.tensor([[1, 2, 3]])

BAD = {
    "empty prompt": (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "prompt is empty"),
    "batch of zero": (dict(input_ids=torch.zeros(0, 3, dtype=torch.long)), ValueError, "batch is empty"),
    "1-d ids": (dict(input_ids=torch.tensor([1, 2, 3])), ValueError, r"input_ids\[None\]"),
    "3-d ids": (dict(input_ids=torch.zeros(1, 2, 3, dtype=torch.long)), ValueError, "batch, prompt_len"),
    "float ids": (dict(input_ids=torch.ones(1, 3)), TypeError, "integer token ids"),
    "not a tensor": (dict(input_ids=[[1, 2, 3]]), TypeError, "torch.Tensor"),
    "id out of vocab": (dict(input_ids=torch.tensor([[1, 50257]])), ValueError, "lie in"),
    "negative id": (dict(input_ids=torch.tensor([[-1, 2]])), ValueError, "lie in"),
    "too long": (dict(max_new_tokens=1022), ValueError, "exceeds the model's 1024 positions"),
    "zero new tokens": (dict(max_new_tokens=0), ValueError, "max_new_tokens must be an int >= 1"),
    "float new tokens": (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
    "bool new tokens": (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int"),
    "short cache": (dict(max_cache_len=5), ValueError, "max_cache_len must be an int in"),
    "seed string": (dict(seed="5"), TypeError, "seed must be an int"),
    "seed float": (dict(seed=1.5), TypeError, "seed must be an int"),
    "seed too big": (dict(seed=2**32), ValueError, "seed must be an int in"),
    "temperature string": (dict(temperature="0.7"), TypeError, "temperature must be a number"),
    "temperature None": (dict(temperature=None), TypeError, "temperature must be a number"),
    "top_k bool": (dict(do_sample=True, top_k=True), TypeError, "top_k must be an int"),
    "do_sample string": (dict(do_sample="False"), TypeError, "do_sample must be True or False"),
    "half mask": (dict(attention_mask=torch.tensor([[0.5, 1.0, 1.0]])), ValueError, "only 0 and 1"),
    "unknown decoder": (dict(decoder="turbo"), ValueError, "unknown decoder 'turbo'"),
    "mask shape": (dict(attention_mask=torch.ones(1, 2, dtype=torch.long)), ValueError, "must match"),
    "mask values": (dict(attention_mask=torch.tensor([[0, 2, 1]])), ValueError, "only 0 and 1"),
    "right padding": (dict(attention_mask=torch.tensor([[1, 1, 0]])), ValueError, "pad prompts on the LEFT"),
    "holes in mask": (dict(attention_mask=torch.tensor([[1, 0, 1]])), ValueError, "left padding"),
    "bad eos": (dict(eos_token_id=10**6), ValueError, "eos_token_id"),
    "bad temperature": (dict(do_sample=True, temperature=0.0), ValueError, "temperature"),
    "bad top_k": (dict(do_sample=True, top_k=0), ValueError, "top_k"),
    "bad streamer": (dict(streamer=object()), TypeError, "streamer must have put"),
}


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("decoder", ["naive", "interleaved"])
def test_bad_input_is_a_clear_error(model, name, decoder):
    kwargs, exc, msg = BAD[name]
    args = dict(input_ids=OK_IDS, decoder=decoder, max_new_tokens=4) | kwargs
    with pytest.raises(exc, match=msg):
        fg.generate(model, args.pop("input_ids"), **args)
    # the same decoder still works after the error
    out = fg.generate(model, OK_IDS, decoder=decoder, max_new_tokens=4)
    assert out.shape == (1, 7)


def test_integer_like_scalars_are_accepted(model):
    import numpy as np
    want = fg.generate(model, OK_IDS, decoder="kv_cache", max_new_tokens=4, eos_token_id=50256)
    for n, eos in ((np.int64(4), np.int64(50256)), (torch.tensor(4), torch.tensor(50256))):
        got = fg.generate(model, OK_IDS, decoder="kv_cache", max_new_tokens=n, eos_token_id=eos)
        assert torch.equal(got, want)


def test_training_mode_is_a_clear_error(model):
    model.train()
    try:
        with pytest.raises(ValueError, match=r"model\.eval\(\)"):
            fg.generate(model, OK_IDS, decoder="kv_cache", max_new_tokens=2)
    finally:
        model.eval()


def test_not_a_causal_lm_is_a_clear_error(model):
    import transformers
    with pytest.raises(TypeError, match=r"fg\.load_model\('gpt2'\)"):
        fg.generate("gpt2", OK_IDS)
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)).eval()
    with pytest.raises(ValueError, match="no language-model head"):
        fg.generate(bert, OK_IDS)


def test_wrong_device_is_a_clear_error(model):
    with pytest.raises(ValueError, match="is on meta but the model is on cpu"):
        fg.generate(model, torch.zeros(1, 3, dtype=torch.long, device="meta"))


def test_bad_model_size_and_weights(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a name that is no shape: the local cache only, no network
    with pytest.raises(ValueError, match="model '7b': not one of"):
        fg.load_model("7b")
    with pytest.raises(ValueError, match="weights="):
        fg.load_model("tiny", weights="maybe")


def test_tokenizer_checks_its_files(monkeypatch):
    import fastgen_lib.models as models
    monkeypatch.setitem(models.TOKENIZER_SHA256, "vocab.json", "0" * 64)
    with pytest.raises(RuntimeError, match="is not GPT-2's"):
        models.load_tokenizer()


def test_random_weights_fallback_is_said_once(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import fastgen_lib.models as models
    monkeypatch.setattr(models.GPT2LMHeadModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(OSError("no cache"))))
    monkeypatch.setattr(models, "_NOTICE_SHOWN", False)
    assert models._pretrained(strict=False) is None and models._pretrained(strict=False) is None
    assert capsys.readouterr().out.count("random weights") == 1  # a note, once, not a warning
    with pytest.raises(ValueError, match="neither cached nor reachable"):  # the CLI: one line
        models._pretrained(strict=True)


LOADING = {  # load_model's and its helpers' bad arguments: refused before anything loads
    "no cuda": (dict(device="cuda"), ValueError, "no CUDA GPU .* use device='cpu'"),
    "no such device": (dict(device="gpu"), ValueError, "device='gpu': not a device"),
    "dtype string": (dict(dtype="bfloat16"), TypeError, "pass torch.bfloat16"),
    "integer dtype": (dict(dtype=torch.int64), TypeError, "floating torch.dtype"),
    "negative seed": (dict(seed=-1), ValueError, "seed must be an int >= 0"),
    "size number": (dict(size=124), TypeError, "size must be one of"),
    "missing path": (dict(size="./no/such/model"), ValueError, "no such folder"),
}


@pytest.mark.parametrize("name", LOADING)
def test_bad_load_model_argument_is_refused_before_loading(name, monkeypatch):
    import fastgen_lib.models as models
    kwargs, exc, msg = LOADING[name]
    if name == "no cuda" and torch.cuda.is_available():
        pytest.skip("a machine without CUDA")
    monkeypatch.setattr(models, "GPT2LMHeadModel", None)  # calling it would be a TypeError of its own
    monkeypatch.setattr(models, "AutoModelForCausalLM", None)
    with pytest.raises(exc, match=msg):
        fg.load_model(**{"size": "tiny"} | kwargs)


@pytest.mark.parametrize("call, exc, msg", [
    (lambda: fg.make_batch(0), ValueError, "batch_size must be an int >= 1, got 0"),
    (lambda: fg.make_batch(2.5), TypeError, "batch_size must be an int, got float"),
    (lambda: fg.make_batch(2, "8"), TypeError, "prompt_len must be an int"),
    (lambda: fg.make_batch(2, seed=-1), ValueError, "seed must be an int >= 0"),
    (lambda: fg.make_batch(2, mixed="no"), TypeError, "mixed must be True or False"),
    (lambda: fg.make_batch(2, vocab_size=300), ValueError, "pad_token_id=50256 is not in vocab_size"),
    (lambda: fg.make_batch(2, device="gpu"), ValueError, "not a device"),
    (lambda: prompts_for("tiny", 2), TypeError, "model must be a transformers model"),
    (lambda: fg.load_tokenizer(3), TypeError, "size must be one of"),
    (lambda: fg.load_tokenizer("./no/such/model"), ValueError, "no such folder"),
])
def test_bad_batch_or_tokenizer_argument(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_a_right_padding_tokenizer_is_refused():
    tok = fg.load_tokenizer()
    tok.padding_side = "right"  # a tokenizer as AutoTokenizer gives it: generate would refuse the batch
    with pytest.raises(ValueError, match="padding_side = 'left'"):
        fg.make_batch(2, tokenizer=tok)


def silent_hub():
    """A socket that takes connections and never answers: a hub behind a firewall that drops."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(256)
    return s


HUB_CALLS = """import time
import fastgen_lib as fg
for size, weights in (("someone/some-model", "auto"), ("gpt2", "pretrained")):
    t0 = time.perf_counter()
    try:
        fg.load_model(size, weights=weights)
    except ValueError as exc:
        print(f"{time.perf_counter() - t0:.1f}", exc)
"""


def test_an_unreachable_hub_fails_within_seconds():
    # huggingface_hub alone retries for minutes here; the probe answers in HUB_TIMEOUT (and
    # huggingface_hub's own 3 s look-up of agent names, once per process)
    hub = silent_hub()
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.getsockname()[1]}"
    p = subprocess.run([sys.executable, "-c", HUB_CALLS], capture_output=True, text=True, env=env,
                       timeout=120)
    hub.close()
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 2, p.stdout + p.stderr
    for line in lines:
        seconds, msg = line.split(" ", 1)
        assert float(seconds) < 20, line  # about 6 s (3 of them CPU) on an idle 2-core machine
        assert "HF_HUB_OFFLINE=1" in msg and "local path" in msg, line
    assert "Retrying" not in p.stderr


INTERPRETED = """import torch, fastgen_lib as fg
model = fg.load_model("tiny", device="cpu")
ids, mask = fg.make_batch(2, 5, mixed=True, seed=1)
kw = dict(max_new_tokens=3, eos_token_id=0, pad_token_id=0)
print(torch.equal(fg.generate(model, ids, mask, decoder="fused", **kw),
                  fg.generate(model, ids, mask, decoder="kv_cache", **kw)))
"""


def test_the_fused_decoder_runs_under_the_interpreter_it_names():
    # off CUDA, the fused decoder's error says TRITON_INTERPRET=1: in a fresh process (no
    # tests/conftest.py) it must then give kv_cache's tokens, the library mending Triton's
    # interpreter itself (fastgen_lib/interpret.py)
    pytest.importorskip("triton")
    p = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True,
                       env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    assert p.returncode == 0 and p.stdout.split()[-1:] == ["True"], p.stderr[-2000:]

"""Model, tokenizer and workload: GPT-2 124M (real weights when present, else random), a tiny config for
CPU work, a Llama-3.2-1B shape with random weights, any transformers causal LM by model id or local path,
and batches of left-padded prompts. Book: chapter 0 (setup)."""
import hashlib
import os
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel,
                          GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM)

from .decoders import _int

TOKENIZER_DIR = Path(__file__).parent / "gpt2_tokenizer"
# The hashes tiktoken pins for GPT-2's encoder.json and vocab.bpe.
TOKENIZER_SHA256 = {
    "vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "merges.txt": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
EOS = 50256  # GPT-2's <|endoftext|>
SIZES = ("124m", "tiny", "llama-1b")  # named shapes; "gpt2" is "124m"
HUB_TIMEOUT = 3  # s for the hub to answer before a download (huggingface_hub retries for a minute)

PROMPTS = [
    "The quick brown fox",
    "In a shocking finding, scientists discovered a herd of unicorns living in a remote valley",
    "Fast token generation on a GPU depends on",
    "Once upon a time",
    "The memory bandwidth of a modern accelerator is",
    "Python is a programming language that",
    "The best way to learn about CUDA streams is",
    "Hello, my name is",
]


def load_tokenizer(size=None):
    """The tokenizer for `load_model(size)`, padding on the left: GPT-2's from the files shipped in the
    package (no network, sha256-checked) for `124m`/`gpt2`/`tiny`; the model's own for a model id or
    path; None for `llama-1b` and a path without tokenizer files (random weights need none: prompts
    are then random token ids, `prompts_for`)."""
    size = _size(size)
    size = "124m" if size in (None, "gpt2") else size
    if size == "llama-1b":
        return None
    if size not in SIZES:
        try:
            tok = _local_first(AutoTokenizer.from_pretrained, size)
        except HubUnreachable:
            raise
        except (OSError, ValueError):
            return None
        tok.pad_token = tok.pad_token or tok.eos_token
        tok.padding_side = "left"
        return tok
    for name, want in TOKENIZER_SHA256.items():
        got = hashlib.sha256((TOKENIZER_DIR / name).read_bytes()).hexdigest()
        if got != want:
            raise RuntimeError(f"{TOKENIZER_DIR / name}: sha256 {got} is not GPT-2's {want}")
    tok = GPT2TokenizerFast.from_pretrained(str(TOKENIZER_DIR))
    tok.pad_token = tok.eos_token  # GPT-2 has no pad token; generate() pads finished rows with EOS
    tok.padding_side = "left"      # decoders append on the right, so prompts are padded on the left
    return tok


def tiny_config():
    """A 2-layer GPT-2 with the real vocabulary: the same code paths, fast on a CPU."""
    return GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=1024)


def llama_1b_config():
    """Llama-3.2-1B's shape (16 layers, hidden 2048, 32 heads, 8 key/value heads, vocabulary 128,256,
    tied embedding): random weights at the real model's speed, where the checkpoint is not at hand."""
    return LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                       rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                       eos_token_id=128001)


def default_size():
    """`FASTGEN_SIZE` picks the model for notebooks and the CLI: `124m` on CUDA, `tiny` on a CPU."""
    size = os.environ.get("FASTGEN_SIZE") or ("124m" if torch.cuda.is_available() else "tiny")
    if size not in SIZES:
        raise ValueError(f"FASTGEN_SIZE={size!r}: expected one of {SIZES}")
    return size


def load_model(size=None, device=None, dtype=torch.float32, weights="auto", seed=0):
    """A causal LM in eval mode. `size`: a named shape, `124m` (= `gpt2`), `tiny` (always random) or
    `llama-1b` (Llama-3.2-1B's shape, always random), or a transformers model id or local path (its
    checkpoint; with weights="random", its config with random weights). `weights` for GPT-2: "auto"
    loads the real `gpt2` checkpoint if it is in the local cache or reachable on the hub, else falls back
    to random weights with a printed notice; "pretrained" insists; "random" skips the lookup. Random
    weights run at exactly the real model's speed: the same shapes, kernels and bytes moved."""
    size = _size(size)
    size = "124m" if size == "gpt2" else size or default_size()
    if weights not in ("auto", "pretrained", "random"):
        raise ValueError(f"weights={weights!r}: expected 'auto', 'pretrained' or 'random'")
    device = _device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        fix = f": pass torch.{dtype}" if isinstance(dtype, str) and hasattr(torch, dtype) else ""
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.bfloat16, got "
                        f"{type(dtype).__name__} {dtype!r}{fix}")
    seed = _int("seed", seed, 0)
    model = None
    if size not in SIZES:  # a model id or a local path
        model = _from_hub(size, weights, seed)
    elif size == "124m" and weights != "random":
        model = _pretrained(strict=weights == "pretrained")
    if model is None:
        torch.manual_seed(seed)
        model = (LlamaForCausalLM(llama_1b_config()) if size == "llama-1b" else
                 GPT2LMHeadModel(tiny_config() if size == "tiny" else GPT2Config()))
        model.fastgen_weights = "random"
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    g = model.generation_config
    if g.pad_token_id is None:  # GPT-2 and Llama have none: finished rows get the (first) EOS
        g.pad_token_id = g.eos_token_id[0] if isinstance(g.eos_token_id, list) else g.eos_token_id
    if size in ("124m", "tiny"):
        g.pad_token_id = EOS
    return model


def _size(size):
    """`size` as given, or a str for a path (`~` expanded): a TypeError for what is neither, a
    ValueError for a path that does not exist (a model id has at most one `/`)."""
    if isinstance(size, os.PathLike):
        size = os.fspath(size)
    if size is None:
        return None
    if not isinstance(size, str):
        raise TypeError(f"size must be one of {SIZES + ('gpt2',)}, a transformers model id or a "
                        f"local path, got {type(size).__name__} {size!r}")
    size = os.path.expanduser(size)
    if (size.startswith(("/", ".")) or size.count("/") > 1) and not Path(size).exists():
        raise ValueError(f"model {size!r}: no such folder (a local path is a folder with "
                         "config.json, as save_pretrained writes it)")
    return size


def _device(device):
    """`device` as a torch.device (None: CUDA where there is a GPU, else the CPU): a ValueError
    naming the fix for a device this machine lacks."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r}: not a device; use 'cpu' or 'cuda'") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"device={device!r}: this machine has no CUDA GPU "
                             "(torch.cuda.is_available() is False): use device='cpu', or "
                             "device=None for the GPU where there is one")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"device={device!r}: this machine has {n} CUDA GPU(s), cuda:0 to "
                             f"cuda:{n - 1}")
    return dev


class HubUnreachable(ValueError):
    """A model id that is not in the local cache, and the hub does not answer."""


def _reach_hub(name):
    """A HubUnreachable within HUB_TIMEOUT seconds where the hub does not answer: huggingface_hub
    itself retries each file for about a minute before it says so."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_TIMEOUT)  # any answer will do
    except Exception as exc:  # httpx's (or requests') errors: no answer at all
        raise HubUnreachable(
            f"model {name!r}: not in the local cache, and the hub ({constants.ENDPOINT}) does not "
            f"answer ({type(exc).__name__}): pass a local path (a folder save_pretrained wrote), "
            f"or download it where the hub answers; HF_HUB_OFFLINE=1 skips the hub") from None


def _from_hub(name, weights, seed):
    """`name` as a transformers model id or local path: the checkpoint, or with weights="random" the
    config alone; the local cache first, the hub unless HF_HUB_OFFLINE=1. A clear error when it is
    neither."""
    try:
        if weights == "random":
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(_local_first(AutoConfig.from_pretrained, name))
            model.fastgen_weights = "random"
        else:
            model = _local_first(AutoModelForCausalLM.from_pretrained, name)
            model.fastgen_weights = f"pretrained {name}"
    except HubUnreachable:
        raise
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {name!r}: not one of {SIZES + ('gpt2',)} and not a transformers causal "
                         f"LM id or path ({str(exc).splitlines()[0][:160]})") from None
    return model


def _local_first(load, name):
    """load(name) from a local path or the cache, else from the hub if it answers."""
    try:
        return load(name, local_files_only=True)
    except (OSError, ValueError):
        if os.environ.get("HF_HUB_OFFLINE") == "1" or Path(name).exists():
            raise
    _reach_hub(name)
    return load(name)


def _pretrained(strict):
    errors = []
    for local in (True, False):  # the local cache first, then the hub
        if not local and os.environ.get("HF_HUB_OFFLINE") == "1":
            break
        try:
            if not local:
                _reach_hub("gpt2")
            model = GPT2LMHeadModel.from_pretrained("gpt2", local_files_only=local)
            model.fastgen_weights = "pretrained gpt2"
            return model
        except HubUnreachable as exc:
            errors.append(str(exc))
        except Exception as exc:  # no cache, no network: fall back below
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    if strict:  # weights="auto" falls back to random weights instead
        raise ValueError("weights='pretrained': the gpt2 checkpoint is neither cached nor "
                         "reachable: " + " | ".join(errors))
    global _NOTICE_SHOWN
    if not _NOTICE_SHOWN:  # once per process: a notebook loads the model in several cells
        _NOTICE_SHOWN = True
        print("Note: the gpt2 checkpoint is not available here, so GPT-2 124M runs with random "
              "weights:\nthe real model's speed (same shapes, same kernels), gibberish text.")
    return None


_NOTICE_SHOWN = False


def set_eos_bias(model, bias, eos_token_id=EOS):
    """Add `bias` to the EOS logit, for `model.generate` and every decoder alike (lm_head gets a bias
    vector that is zero except at EOS; its weight stays tied to the embedding). Random weights almost never
    emit EOS; a bias makes rows finish at different steps, so early stopping happens in demos: about 0.7
    for the tiny model and 2.0 for GPT-2 124M with random weights (under greedy decoding some rows then
    stop early and others never). `bias=0` removes it. GraphSteps captured the old lm_head, so
    they are freed here (`decoders.reset`) and rebuilt on the next call."""
    from .decoders import reset
    head = model.lm_head
    reset(model)  # their CUDA graphs read the old bias (or none)
    if bias == 0:
        head.bias = None
        return model
    b = torch.zeros(head.out_features, device=head.weight.device, dtype=head.weight.dtype)
    b[eos_token_id] = bias
    head.bias = torch.nn.Parameter(b, requires_grad=False)
    return model


def stop_ids(model):
    """(eos, pad) for `model`, from its generation config (a list of EOS ids stays a list); GPT-2's
    EOS where it has none; pad defaults to the (first) EOS."""
    g = model.generation_config
    eos = g.eos_token_id if g.eos_token_id is not None else EOS
    pad = g.pad_token_id if g.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    return eos, pad


def prompts_for(model, batch_size, prompt_len=16, **kwargs):
    """`make_batch` for `model`: random ids from its vocabulary, padded with its pad id, on its device."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers model (load_model(...)), got "
                        f"{type(model).__name__} {model!r:.60}")
    return make_batch(batch_size, prompt_len, vocab_size=model.config.vocab_size,
                      pad_token_id=stop_ids(model)[1], device=model.device, **kwargs)


def make_batch(batch_size, prompt_len=16, *, mixed=True, vocab_size=50257, seed=0, device="cpu",
               tokenizer=None, pad_token_id=EOS):
    """A left-padded batch: `input_ids` [B, T] and `attention_mask` [B, T]. With `mixed`, row b keeps
    between T/2 and T real tokens (the rest is padding: `pad_token_id`, GPT-2's EOS by default), so the
    decoders must handle positions and masks. With a `tokenizer`, rows are real English prompts
    (`PROMPTS`, cycled) instead of random ids."""
    batch_size, prompt_len = _int("batch_size", batch_size, 1), _int("prompt_len", prompt_len, 1)
    device, g = _device(device), torch.Generator().manual_seed(_int("seed", seed, 0))
    if tokenizer is not None:
        if tokenizer.pad_token is None or tokenizer.padding_side != "left":
            raise ValueError("the tokenizer must pad on the left, with a pad token: set "
                             "tokenizer.padding_side = 'left' and tokenizer.pad_token = "
                             "tokenizer.eos_token (load_tokenizer does)")
        texts = [PROMPTS[i % len(PROMPTS)] for i in range(batch_size)]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)
    vocab_size = _int("vocab_size", vocab_size, 1)
    if mixed not in (True, False):
        raise TypeError(f"mixed must be True or False, got {mixed!r}")
    if _int("pad_token_id", pad_token_id, 0) >= vocab_size:
        raise ValueError(f"pad_token_id={pad_token_id} is not in vocab_size={vocab_size}: pass "
                         "pad_token_id too, or use prompts_for(model, ...)")
    ids = torch.randint(0, vocab_size, (batch_size, prompt_len), generator=g)
    mask = torch.ones(batch_size, prompt_len, dtype=torch.long)
    if mixed and prompt_len > 1:
        lengths = torch.randint((prompt_len + 1) // 2, prompt_len + 1, (batch_size,), generator=g)
        lengths[0] = prompt_len  # one full row, so T is really the prompt length
        for b, n in enumerate(lengths.tolist()):
            mask[b, : prompt_len - n] = 0
            ids[b, : prompt_len - n] = pad_token_id
    return ids.to(device), mask.to(device)

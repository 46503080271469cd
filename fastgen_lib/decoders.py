"""The decoders, one per chapter: each is a step backend (`steps.py`: how a step is
computed) driven by a stop driver (`stops.py`: when the host learns that every row has
finished), paired in `registry.METHODS`. All have the same signature and, under greedy
decoding, the same tokens as `model.generate`. `generate()` is the entry point. A
GraphStep is kept on the model for the next call with the same shapes and settings (its
compile, graphs and buffers); `reset(model)` frees them. Calls on one model from several
threads queue: one runs at a time.
"""
import importlib
import math
import numbers
import operator
import threading
from dataclasses import replace

import numpy as np
import torch

from .registry import FAMILIES, METHODS, NEEDS, have
from .steps import GenConfig, attention_choice

DECODERS = {n: m for n, m in METHODS.items() if m.step}  # public name -> registry entry


def parts(decoder):
    """`decoder`'s step backend and stop driver, imported on first use (the fused step imports
    Triton): a ValueError names what is missing."""
    m = DECODERS[decoder]

    def load(ref):
        module, name = ref.split(":")
        try:
            return getattr(importlib.import_module(f".{module}", __package__), name)
        except ImportError as e:
            raise ValueError(f"the {decoder} decoder needs "
                             f"{' and '.join(NEEDS[n] for n in m.needs)} ({e})") from e
    backend, driver = load(m.step), load(m.stop)
    for need in m.needs:  # a CUDA GPU: a backend with a CPU path (the interpreter) says it
        if (need != "cuda" or driver.cuda) and not have(need):
            raise ValueError(f"the {decoder} decoder needs {NEEDS[need]}")
    return backend, driver


def decode(model, input_ids, attention_mask, gen, step_backend, stop_driver, streamer=None):
    """One decode: the backend runs the prompt and chooses its token, the driver runs the other steps
    and says how many tokens to keep. Any backend works with any driver that it offers what the
    driver needs on a CUDA GPU (`stops.Driver.needs`, the backend's `offers(gen)`). A `streamer`
    gets what `model.generate` gives one: the prompt, each new token [B] in order, then `end()`."""
    name = getattr(stop_driver.run, "__name__", "this stop driver")
    missing = stop_driver.needs - step_backend.offers(gen)
    if missing and (input_ids.is_cuda or stop_driver.cuda):
        raise ValueError(f"{name} needs {'; '.join(sorted(missing))}: "
                         f"{step_backend.__name__} does not offer it")
    if stop_driver.cuda and not input_ids.is_cuda:
        raise ValueError(f"{name} needs a CUDA GPU, and the inputs are on {input_ids.device}")
    step = step_backend.start(model, input_ids, attention_mask, gen, stop_driver.slots)
    if streamer is None:
        return step.tokens(stop_driver(step, gen.max_new_tokens))
    streamer.put(input_ids.cpu())
    out = step.tokens(stop_driver(step, gen.max_new_tokens, streamer))
    streamer.end()
    return out


def attention_of(model, decoder, decode_attention="auto"):
    """The attention that `decoder`'s decode steps run: GraphStep's choice (`attention_choice`), or
    the model's own for the eager steps and `model.generate`. Every result row records it."""
    step = DECODERS[decoder].step if decoder in DECODERS else ""
    if step == "fused:FusedStep":
        return "fused"  # its own Triton kernel (fused.attention)
    if step == "steps:GraphStep":
        return attention_choice(model.dtype, decode_attention)
    return model.config._attn_implementation


def reset(model):
    """Free what the compiled decoders keep on `model` (each GraphStep's StaticCache, buffers and CUDA
    graphs; `torch.cuda.empty_cache()` then returns the memory to the GPU). Returns how many there
    were. The compiled code stays: torch.compile keeps it per process (`torch.compiler.reset()`)."""
    with lock(model):
        return len(model.__dict__.pop("_fastgen_steps", {}))


def lock(model):
    """`model`'s lock: calls from several threads queue (the compiled decoders keep one set of
    buffers and graphs per shape on the model)."""
    return model.__dict__.setdefault("_fastgen_lock", threading.RLock())


# --- the entry point -------------------------------------------------------------------------------------

def generate(model, input_ids, attention_mask=None, *, decoder="interleaved", max_new_tokens=32,
             max_cache_len=None, eos_token_id=None, pad_token_id=None, do_sample=False,
             temperature=1.0, top_k=None, seed=None, decode_attention="auto", streamer=None):
    """Generate with one of `DECODERS`. `input_ids` [B, T] int64 on the model's device, left-padded;
    `attention_mask` [B, T] of 0/1 (all ones if None). Returns [B, T + n] like `model.generate`: the
    prompt then n <= max_new_tokens new tokens; rows that finished early are padded with `pad_token_id`.
    `max_cache_len` (static caches: `static_cache` and the compiled decoders) is the number of cache
    slots every step attends over, default T + max_new_tokens (chapter 4 sweeps it);
    `decode_attention` the compiled decoders' attention (`attention_choice`, chapter 5).
    `eos_token_id` (an int or a list: a row finishes on any) defaults to the model's; `pad_token_id`
    to the model's, else the first eos. Sampling (`do_sample`,
    `temperature`, `top_k`) is reproducible: the same `seed`, an int in [0, 2**32), gives the same
    tokens on every decoder; `seed=None` draws one from torch's CPU generator (`torch.manual_seed`
    fixes it). `streamer` (transformers' `TextStreamer` or any object with `put` and `end`) gets the
    tokens as they are made, as from `model.generate(streamer=...)`: with `deferred` and `interleaved`,
    one step late, while the next step runs (chapter 7). Integer arguments accept any integer-like
    scalar (numpy ints, 0-d tensors). Bad input gets a ValueError or TypeError naming the argument,
    before anything runs. Calls on one model from several threads queue, one at a time, each with
    its serial call's tokens (`lock`)."""
    if not isinstance(decoder, str) or decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    supported(model, DECODERS[decoder])
    backend, driver = parts(decoder)
    if streamer is not None and not (hasattr(streamer, "put") and hasattr(streamer, "end")):
        raise TypeError(f"streamer must have put() and end() (transformers' TextStreamer), got "
                        f"{type(streamer).__name__}")
    if streamer is not None and not driver.streams:
        raise ValueError(f"{decoder} cannot stream: the host sees no token until the end")
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
    if pad_token_id is None:
        first = eos_token_id[0] if isinstance(eos_token_id, (list, tuple)) and eos_token_id else eos_token_id
        pad_token_id = first if first is not None else 0
    gen, attention_mask = _validate(model, input_ids, attention_mask, max_new_tokens, max_cache_len,
                                    eos_token_id, pad_token_id, do_sample, temperature, top_k,
                                    seed)
    gen = replace(gen, decode_attention=attention_choice(model.dtype, decode_attention))
    if gen.do_sample and seed is None:  # from torch's CPU generator: torch.manual_seed fixes it
        gen = replace(gen, seed=int(torch.randint(0, 2**32, (), dtype=torch.long)))
    # the named range lets a profiler trace tell the decode from the input checks above
    with lock(model), torch.inference_mode(), torch.profiler.record_function(f"fastgen.{decoder}"):
        return decode(model, input_ids, attention_mask, gen, backend, driver, streamer)


def supported(model, method=None):
    """A ValueError naming the model type and the reason, for a model the decoders (or registry
    entry `method`) cannot run: not a decoder-only causal LM, a cache layout StaticCache does not
    hold (it needs full attention layers; transformers says so with `_can_compile_fullgraph`), or
    a family outside `method.families`. A TypeError for what is not a transformers model."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        hint = f": load it first, fg.load_model({model!r})" if isinstance(model, str) else ""
        raise TypeError(f"model must be a transformers causal LM, got {type(model).__name__}"
                        + hint)
    cfg, kind = model.config, getattr(model.config, "model_type", type(model).__name__)
    if getattr(cfg, "is_encoder_decoder", False):
        raise ValueError(f"{kind}: an encoder-decoder model; the decoders run decoder-only causal LMs")
    if not hasattr(model, "generation_config") or not hasattr(model, "get_output_embeddings") \
            or model.get_output_embeddings() is None:
        raise ValueError(f"{kind}: no language-model head ({type(model).__name__}); load it with "
                         "AutoModelForCausalLM")
    if not getattr(model, "_can_compile_fullgraph", False):
        raise ValueError(f"{kind}: transformers does not support a static cache (StaticCache) for "
                         "this model, which the compiled decoders need")
    if method is not None and method.families and kind not in method.families:
        runs = ", ".join(FAMILIES.get(f, f) for f in method.families)
        raise ValueError(f"the {method.name} decoder runs {runs}, not {kind}: the decoders "
                         "up to interleaved run it")


def _int(name, value, lo, hi=None, none=False):
    """`value` as a Python int in [lo, hi) (any integer-like scalar: numpy, 0-d tensor; not a bool)."""
    if value is None and none:
        return None
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor)
                                               and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got the bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if v < lo or (hi is not None and v >= hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
        raise ValueError(f"{name} must be an int {rng}, got {v}")
    return v


def _validate(model, input_ids, attention_mask, max_new_tokens, max_cache_len, eos, pad, do_sample,
           temperature, top_k, seed):
    """Bad input gets a ValueError/TypeError naming the problem, before any state is touched.
    Returns the GenConfig and the attention mask as int64."""
    cfg = model.config
    if model.training:
        raise ValueError("the model is in training mode (dropout on: every call would differ): "
                         "call model.eval() first")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids (int64), got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, prompt_len], got shape {tuple(input_ids.shape)}"
                         + (" (use input_ids[None] for one prompt)" if input_ids.dim() == 1 else ""))
    B, T = input_ids.shape
    if B == 0:
        raise ValueError("the batch is empty (input_ids has 0 rows)")
    if T == 0:
        raise ValueError("the prompt is empty (input_ids has 0 columns): give at least one token")
    if input_ids.device != model.device:
        raise ValueError(f"input_ids is on {input_ids.device} but the model is on {model.device}")
    N = _int("max_new_tokens", max_new_tokens, 1)
    limit = getattr(cfg, "max_position_embeddings", None) or 10**9  # GPT-2's n_positions too
    if T + N > limit:
        raise ValueError(f"prompt ({T}) + max_new_tokens ({N}) = {T + N} exceeds "
                         f"the model's {limit} positions")
    L = _int("max_cache_len", max_cache_len, T + N, limit + 1, none=True)
    if bool((input_ids < 0).any()) or bool((input_ids >= cfg.vocab_size).any()):
        raise ValueError(f"input_ids must lie in [0, {cfg.vocab_size})")
    if isinstance(eos, (list, tuple)):  # a row finishes on any of them (Llama 3's generation config)
        eos = tuple(_int("eos_token_id", e, 0, cfg.vocab_size) for e in eos) or None
    else:
        eos = _int("eos_token_id", eos, 0, cfg.vocab_size, none=True)
        eos = None if eos is None else (eos,)
    pad = _int("pad_token_id", pad, 0, cfg.vocab_size)
    if not isinstance(do_sample, (bool, np.bool_)):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not math.isfinite(temperature) or (do_sample and not temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    top_k = _int("top_k", top_k, 1, cfg.vocab_size + 1, none=True)
    seed = _int("seed", seed, 0, 2**32, none=True)
    gen = GenConfig(N, eos, pad, bool(do_sample), float(temperature), top_k, seed or 0, L)
    if attention_mask is None:
        return gen, torch.ones_like(input_ids, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = (tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor)
                 else type(attention_mask).__name__)
        raise ValueError(f"attention_mask must match input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {shape}")
    if attention_mask.device != input_ids.device:
        raise ValueError(f"attention_mask is on {attention_mask.device}, input_ids on "
                         f"{input_ids.device}")
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    mask = attention_mask.long()
    if not bool((mask[:, -1] == 1).all()):
        raise ValueError("attention_mask: every row's last token must be real (mask 1): pad prompts "
                         "on the LEFT (tokenizer.padding_side = 'left'); a row may not be all padding")
    if bool((mask.diff(dim=-1) < 0).any()):
        raise ValueError("attention_mask must be left padding: zeros, then ones, in every row")
    return gen, mask

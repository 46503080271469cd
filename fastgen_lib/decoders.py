"""The decoders, one per chapter, all with the same signature and, under greedy decoding, the same tokens
as `model.generate`:

    naive        ch. 1  re-run the whole sequence every step (no cache)            O(N^2)
    kv_cache     ch. 2  DynamicCache: keys/values grow by one position per step    O(N)
    static_cache ch. 4  StaticCache: one buffer of the final length, eager
    compiled     ch. 5  StaticCache + torch.compile, the step replayed as a CUDA graph
    deferred     ch. 7  compiled, but the host reads step i-1's "all finished" flag while step i runs
    interleaved  ch. 7  deferred on two CUDA streams in ping-pong: the flag copy leaves the critical path

Every decoder checks for early stopping after every token; each marks where the host waits for the GPU.
`generate()` is the entry point; `DECODERS` maps the names to the functions.
"""
import contextlib
import math
import numbers
import operator
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, DynamicCache, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

MAX_RUNNERS = 8  # compiled runners (cache + graphs) kept per model; the oldest is dropped first
WARMUP_SLOTS = (0, 1, 0)  # the steps a Runner runs before capture: each variant, then one more
MIN_LENGTH = 2 + len(WARMUP_SLOTS)  # a scratch prefill (column 0), its token (1), then one per step


@dataclass(frozen=True)
class GenConfig:
    max_new_tokens: int
    eos_token_id: int | None
    pad_token_id: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    max_cache_len: int | None = None  # static caches: slots to allocate (None: prompt + new tokens)
    decode_attention: str = "one_query"  # the compiled step's attention (ATTENTION)


# --- choosing the next token: shared by every decoder, never syncs --------------------------------------

M32 = 0xFFFFFFFF


def _mix(x):
    # a 32-bit integer hash kept in int64: values < 2**32 times constants < 2**31 never overflow
    x = x & M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & M32
    return x ^ (x >> 16)


def gumbel_noise(seed, step, batch, vocab, device):
    """Gumbel noise [batch, vocab] as a pure function of (seed, step, row, token id): sampling needs no RNG
    state and no host sync, replays inside a CUDA graph, and every decoder draws the same numbers.
    `seed` is an int64 tensor (0-d) and `step` one too in the compiled step (a Python int in the eager
    loops): a new seed or step never recompiles, and both give the same numbers."""
    row = torch.arange(batch, device=device)[:, None]
    tok = torch.arange(vocab, device=device)[None, :]
    x = _mix(_mix(_mix(seed) ^ step) ^ (row * vocab + tok))
    # uniform in (0, 1): 23 bits + 0.5 over 2**23 is exact in float32 and never rounds up to 1
    # (24 bits did: 2**24 - 0.5 rounds to 2**24, u = 1, the noise +inf, and top-k masking NaN)
    u = ((x >> 9).float() + 0.5) * (1.0 / 2**23)
    return -torch.log(-torch.log(u))


def choose(logits, finished, step, seed, gen):
    """logits [B, V] float32 -> next token [B]. Greedy is argmax; sampling is argmax(logits/T + Gumbel),
    which draws from softmax(logits/T) (top-k first masks all but the k largest). Finished rows get the
    pad token; `finished` [B] bool is updated in place. No host sync anywhere."""
    if gen.do_sample:
        logits = logits / gen.temperature
        if gen.top_k is not None:
            kth = torch.topk(logits, gen.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        logits = logits + gumbel_noise(seed, step, logits.shape[0], logits.shape[1], logits.device)
    nxt = torch.argmax(logits, dim=-1)
    nxt = torch.where(finished, gen.pad_token_id, nxt)
    if gen.eos_token_id is not None:
        finished |= nxt == gen.eos_token_id
    return nxt


# --- pieces the decoders share ---------------------------------------------------------------------------

def positions(mask):
    """[B, S] attention mask -> position ids: 0, 1, 2, ... over each row's real tokens; pads get 0 (as
    `model.generate` does), so a left-padded row starts at position 0 like an unpadded one."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def forward(model, ids, mask, pos, cache=None):
    """One forward pass -> float32 logits [B, V] of the last position only (`logits_to_keep=1`, as
    `model.generate` does: the lm_head skips the other positions)."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                use_cache=cache is not None, logits_to_keep=1)
    return out.logits[:, -1].float()


def _buffers(input_ids, attention_mask, gen, length=None):
    # out [B, T+N]: the prompt, then room for every new token; mask/pos [B, L] with L = `length` (the
    # cache length, default T+N) >= T+N: generated tokens count, and so do unused cache slots (the
    # causal mask hides those)
    B, T = input_ids.shape
    L = length or T + gen.max_new_tokens
    out = torch.full((B, T + gen.max_new_tokens), gen.pad_token_id, dtype=torch.long,
                     device=input_ids.device)
    out[:, :T] = input_ids
    mask = torch.ones(B, L, dtype=torch.long, device=input_ids.device)
    mask[:, :T] = attention_mask
    return out, mask, positions(mask), torch.zeros(B, dtype=torch.bool, device=input_ids.device)


def _seed(gen, device):
    return torch.tensor(gen.seed, dtype=torch.long, device=device)


# --- ch. 1-4: eager decoders -----------------------------------------------------------------------------

def naive(model, input_ids, attention_mask, gen):
    """Ch. 1: no cache. Step i re-runs all T+i tokens, so N tokens cost O(N^2)."""
    out, mask, pos, finished = _buffers(input_ids, attention_mask, gen)
    T, seed = input_ids.shape[1], _seed(gen, input_ids.device)
    for i in range(gen.max_new_tokens):
        n = T + i
        logits = forward(model, out[:, :n], mask[:, :n], pos[:, :n])
        out[:, n] = choose(logits, finished, n, seed, gen)
        if finished.all().item():  # host waits for the GPU here, every step
            return out[:, : n + 1]
    return out


def kv_cache(model, input_ids, attention_mask, gen):
    """Ch. 2: DynamicCache. Each step feeds one token; keys/values grow by one position (a new, slightly
    larger allocation per layer per step: what fragments the caching allocator)."""
    out, mask, pos, finished = _buffers(input_ids, attention_mask, gen)
    T, seed = input_ids.shape[1], _seed(gen, input_ids.device)
    cache = DynamicCache(config=model.config)
    logits = forward(model, input_ids, mask[:, :T], pos[:, :T], cache)  # prefill: the whole prompt once
    for i in range(gen.max_new_tokens):
        n = T + i
        out[:, n] = choose(logits, finished, n, seed, gen)
        if i == gen.max_new_tokens - 1 or finished.all().item():  # host waits for the GPU here
            return out[:, : n + 1]
        logits = forward(model, out[:, n : n + 1], mask[:, : n + 1], pos[:, n : n + 1], cache)


def static_cache(model, input_ids, attention_mask, gen):
    """Ch. 4: StaticCache of `max_cache_len` slots (default: the final length T+N), allocated once per
    call. Every step attends over all of them (the mask hides the unused ones): fixed shapes, at the
    price of wasted attention."""
    T, seed = input_ids.shape[1], _seed(gen, input_ids.device)
    L = gen.max_cache_len or T + gen.max_new_tokens
    out, mask, pos, finished = _buffers(input_ids, attention_mask, gen, L)
    cache = StaticCache(config=model.config, max_cache_len=L)
    logits = forward(model, input_ids, mask, pos[:, :T], cache)  # the mask spans the whole cache
    for i in range(gen.max_new_tokens):
        n = T + i
        out[:, n] = choose(logits, finished, n, seed, gen)
        if i == gen.max_new_tokens - 1 or finished.all().item():  # host waits for the GPU here
            return out[:, : n + 1]
        logits = forward(model, out[:, n : n + 1], mask, pos[:, n : n + 1], cache)


# --- ch. 5-7: one compiled step, replayed ----------------------------------------------------------------

def decode_step(model, cache, gen, tok, step_pos, mask, col, seed, finished, out, done):
    """One whole decode step, the function that is compiled: forward on `tok` [B, 1], choose the next
    token, write it into `out` [B, L] at column `col` and into `tok`, advance the position, and set
    `done` (0-d: "all rows finished"). Only in-place writes, so it replays as a CUDA graph."""
    col += 1
    logits = forward(model, tok, mask, step_pos, cache)
    nxt = choose(logits, finished, col, seed, gen)
    out.index_copy_(1, col.view(1), nxt[:, None])
    tok.copy_(nxt[:, None])
    step_pos += 1
    done.copy_(finished.all())


def one_query_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for a decode step (one query token) as plain tensor math, which torch.compile fuses into a
    few small reductions. Shapes: query [B, H, 1, D], key/value [B, H, S, D] (the whole static cache),
    attention_mask bool [B, 1, 1, S] (True = attend). Returns [B, 1, H, D], like transformers' kernels.
    Longer queries (the prefill) go to SDPA."""
    if query.shape[2] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (query.float() * key.float()).sum(-1) * scaling                   # [B, H, S]
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask[:, :, 0], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights[..., None] * value.float()).sum(-2)                         # [B, H, D]
    return out.to(value.dtype)[:, None], None


AttentionInterface.register("fastgen_one_query", one_query_attention)
AttentionMaskInterface.register("fastgen_one_query", sdpa_mask)  # the same boolean mask SDPA gets
ATTENTION = {"one_query": "fastgen_one_query", "sdpa": "sdpa", "math": "sdpa"}


def attention_choice(dtype=torch.float32, choice="auto"):
    """The compiled step's attention, `generate(decode_attention=...)`: `one_query` (ours), `sdpa`
    (PyTorch's fused kernel, as `model.generate`), `math` (SDPA's unfused path) or `auto`: `one_query`
    in float32, else `sdpa`. Measured on the H200 (chapter 5): in float32, SDPA spent 18 us per layer on
    one query token and `one_query` is faster; in bfloat16 SDPA's flash kernel wins."""
    if not isinstance(choice, str) or (choice != "auto" and choice not in ATTENTION):
        raise ValueError(f"decode_attention={choice!r}: expected 'auto' or one of {sorted(ATTENTION)}")
    return ("one_query" if dtype == torch.float32 else "sdpa") if choice == "auto" else choice


def attention_of(model, decoder, decode_attention="auto"):
    """The attention that `decoder`'s decode steps run: the compiled step's choice
    (`attention_choice`), or the model's own for the eager decoders. Every result row records it."""
    if decoder in ("compiled", "deferred", "interleaved"):
        return attention_choice(model.dtype, decode_attention)
    return model.config._attn_implementation


@contextlib.contextmanager
def decode_attention(model, choice):
    """Switch the model's attention to `choice` (one of ATTENTION) while the compiled step is traced
    (and, off CUDA, run); the eager decoders and `model.generate` keep the model's own. A model on
    eager or flash attention keeps it."""
    config, saved = model.config, model.config._attn_implementation
    if saved not in ("sdpa", ATTENTION["one_query"]):
        yield
        return
    config._attn_implementation = ATTENTION[choice]
    try:
        with sdpa_kernel([SDPBackend.MATH]) if choice == "math" else contextlib.nullcontext():
            yield
    finally:
        config._attn_implementation = saved


# dynamic=True: sizes are symbolic, so most new batch sizes and cache lengths reuse a compile (dynamo
# still specializes sizes 0 and 1, and a size equal to another dimension can force one more). Each Runner
# captures its own graphs. Every variant (dtype, sampling settings, an lm_head bias) is one more compile of
# this one function: raise dynamo's limit of 8 so a sweep never hits it.
compiled_step = torch.compile(decode_step, fullgraph=True, dynamic=True)
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


@contextlib.contextmanager
def quiet_compile():
    """Silence inductor's two pieces of advice at compile time, which are not about correctness:
    TF32 (the book keeps float32 matmuls exact, so the tokens equal `model.generate`'s) and "online
    softmax disabled" (a note about its own reduction strategy). Other warnings still show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
        warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled")
        yield


class Runner:
    """What a compiled decode reuses, built once per (model, batch, cache length, sampling settings): the
    StaticCache, the step's input/output buffers, the compiled step and, on CUDA, one CUDA graph per
    stream, two streams, their events and the pinned flags the host reads. A step is self-contained on the
    device: it reads `tok`/`pos`, writes the next token into `out` and `tok`, and sets `done[slot]`, so the
    host only launches it."""

    def __init__(self, model, batch, length, gen):
        dev = model.device
        self.model, self.gen, self.cuda = model, gen, dev.type == "cuda"
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.out = torch.zeros(batch, length, dtype=torch.long, device=dev)   # prompt + new tokens
        self.mask = torch.ones(batch, length, dtype=torch.long, device=dev)   # spans the whole cache
        self.pos = torch.zeros(batch, length, dtype=torch.long, device=dev)   # position ids, all columns
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)        # the token fed next
        self.step_pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)   # its position id
        self.col = torch.zeros((), dtype=torch.long, device=dev)              # its column in `out`
        self.seed = torch.zeros((), dtype=torch.long, device=dev)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.done = torch.zeros(2, dtype=torch.bool, device=dev).unbind()     # "all finished", one per slot
        self.flags = torch.zeros(2, dtype=torch.bool, pin_memory=self.cuda)   # host copies of `done`
        self.graphs, self.compile_s = None, None
        if self.cuda:
            self.streams = [torch.cuda.Stream(dev), torch.cuda.Stream(dev)]
            self.computed = [torch.cuda.Event(), torch.cuda.Event()]  # step i's graph has finished
            self.copied = [torch.cuda.Event(), torch.cuda.Event()]    # step i's flag is in `flags`

    def prefill(self, input_ids, attention_mask, seed=0):
        """Eager prefill of a new request into the reused buffers (in place: graph addresses stay valid)."""
        T = input_ids.shape[1]
        self.cache.reset()  # zeroes K/V and the cache's write position
        self.mask[:, :T] = attention_mask
        self.mask[:, T:] = 1
        self.pos.copy_(positions(self.mask))
        self.out.fill_(self.gen.pad_token_id)
        self.out[:, :T] = input_ids
        self.finished.zero_()
        self.seed.fill_(seed)
        self.col.fill_(T)
        logits = forward(self.model, input_ids, self.mask, self.pos[:, :T], self.cache)
        nxt = choose(logits, self.finished, self.col, self.seed, self.gen)
        self.out[:, T] = nxt
        self.tok.copy_(nxt[:, None])
        self.step_pos.copy_(self.pos[:, T : T + 1])
        self.done[0].copy_(self.finished.all())

    @quiet_compile()
    def warm_up(self):
        """Compile, then (CUDA) capture one graph per slot. The steps run on a scratch prefill of one
        token, so they write columns 1-4 whatever the request (the Runner has at least `MIN_LENGTH`):
        never past the buffers, even for max_new_tokens=1. The caller prefills again for real. Sets
        `compile_s`, the seconds this took."""
        import time
        t0 = time.perf_counter()
        B, dev = self.out.shape[0], self.out.device
        self.prefill(torch.zeros(B, 1, dtype=torch.long, device=dev),
                     torch.ones(B, 1, dtype=torch.long, device=dev))
        if not self.cuda:
            self.compiled_step(0)
            self.compile_s = time.perf_counter() - t0
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for slot in WARMUP_SLOTS:  # compile both variants; lazy init is done before capture
                self.compiled_step(slot)
        torch.cuda.current_stream().wait_stream(side)
        self.graphs = []
        for slot in (0, 1):  # capture records the launches; it runs nothing
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.compiled_step(slot)
            self.graphs.append(g)
        torch.cuda.synchronize()
        self.compile_s = time.perf_counter() - t0

    def compiled_step(self, slot):
        with decode_attention(self.model, self.gen.decode_attention):
            compiled_step(self.model, self.cache, self.gen, self.tok, self.step_pos, self.mask, self.col,
                          self.seed, self.finished, self.out, self.done[slot])

    def step(self, slot=0):
        """Launch one decode step on the current stream (a graph replay on CUDA); never waits."""
        if self.graphs is not None:
            self.graphs[slot].replay()
        else:
            self.compiled_step(slot)

    def copy_flag(self, slot):
        """Queue the copy of done[slot] into pinned host memory on the current stream; mark it with an event."""
        self.flags[slot].copy_(self.done[slot], non_blocking=True)
        if self.cuda:
            self.copied[slot].record()

    def read_flag(self, slot):
        if self.cuda:
            self.copied[slot].synchronize()  # host waits for the GPU here: until that flag has landed
        return bool(self.flags[slot])


def runner_for(model, input_ids, gen):
    """The model's Runner for this batch size, cache length and sampling settings: made (and compiled,
    and captured) the first time, reused after. The cache length is `max_cache_len` (default T+N), at
    least MIN_LENGTH: the warm-up's steps need the room; the causal mask hides unused slots."""
    runners = model.__dict__.setdefault("_fastgen_runners", OrderedDict())
    B, T = input_ids.shape
    L = max(gen.max_cache_len or T + gen.max_new_tokens, MIN_LENGTH)
    key = (B, L, gen.do_sample, gen.temperature, gen.top_k, gen.eos_token_id,
           gen.pad_token_id, model.dtype, str(model.device), gen.decode_attention)
    if key not in runners:
        while len(runners) >= MAX_RUNNERS:
            runners.popitem(last=False)
        # the seed lives in a tensor, so the compiled step never sees (or recompiles for) its value
        runners[key] = Runner(model, B, L, replace(gen, seed=0, max_new_tokens=0, max_cache_len=None))
    runners.move_to_end(key)
    return runners[key]


def _ready(model, input_ids, attention_mask, gen):
    r = runner_for(model, input_ids, gen)
    if r.compile_s is None:
        r.warm_up()
    r.prefill(input_ids, attention_mask, gen.seed)
    return r


def _result(r, n):
    # every stream we used has finished before the caller's stream reads `out`; no host wait
    if r.cuda:
        for s in r.streams:
            torch.cuda.current_stream().wait_stream(s)
    return r.out[:, :n].clone()


def compiled(model, input_ids, attention_mask, gen):
    """Ch. 5: the compiled step, replayed; the host reads "all finished" after every step."""
    r = _ready(model, input_ids, attention_mask, gen)
    T = input_ids.shape[1]
    for i in range(1, gen.max_new_tokens):
        if r.done[0].item():  # host waits for the GPU here: the GPU idles until the next launch
            return _result(r, T + i)
        r.step(0)
    return _result(r, T + gen.max_new_tokens)


def deferred(model, input_ids, attention_mask, gen):
    """Ch. 7, one stream: launch step i first, then read step i-1's flag, copied non-blocking into pinned
    memory. The GPU always has the next step queued; when the flag says stop, step i is thrown away.
    Steps alternate between the two flag slots (and graphs), so a flag is never overwritten unread."""
    r = _ready(model, input_ids, attention_mask, gen)
    T = input_ids.shape[1]
    r.copy_flag(0)  # the prefill's flag (token T)
    for i in range(1, gen.max_new_tokens):
        slot = i % 2
        r.step(slot)
        r.copy_flag(slot)
        if r.read_flag(1 - slot):  # step i-1's flag; the GPU is busy with step i meanwhile
            return _result(r, T + i)
    return _result(r, T + gen.max_new_tokens)


def interleaved(model, input_ids, attention_mask, gen):
    """Ch. 7, the final decoder: `deferred` on two CUDA streams in ping-pong. Step i runs on stream i%2
    with its own graph and flag slot; the next step waits (on the GPU) only for step i's compute, so the
    flag copy of step i overlaps step i+1 instead of sitting between them. On a CPU there are no streams
    and this is `deferred`."""
    if model.device.type != "cuda":
        return deferred(model, input_ids, attention_mask, gen)
    r = _ready(model, input_ids, attention_mask, gen)
    T = input_ids.shape[1]
    r.computed[0].record()  # the prefill (token T) is step 0, on the caller's stream
    r.copy_flag(0)
    for i in range(1, gen.max_new_tokens):
        slot = i % 2
        s = r.streams[slot]
        s.wait_event(r.computed[1 - slot])  # GPU-side wait for step i-1's token and cache; host goes on
        with torch.cuda.stream(s):
            r.step(slot)
            r.computed[slot].record()
            r.copy_flag(slot)
        if r.read_flag(1 - slot):  # step i-1's flag: host waits for the GPU here, one step behind
            return _result(r, T + i)
    return _result(r, T + gen.max_new_tokens)


DECODERS = {
    "naive": naive,
    "kv_cache": kv_cache,
    "static_cache": static_cache,
    "compiled": compiled,
    "deferred": deferred,
    "interleaved": interleaved,
}


# --- the entry point -------------------------------------------------------------------------------------

def generate(model, input_ids, attention_mask=None, *, decoder="interleaved", max_new_tokens=32,
             max_cache_len=None, eos_token_id=None, pad_token_id=None, do_sample=False,
             temperature=1.0, top_k=None, seed=None, decode_attention="auto"):
    """Generate with one of `DECODERS`. `input_ids` [B, T] int64 on the model's device, left-padded;
    `attention_mask` [B, T] of 0/1 (all ones if None). Returns [B, T + n] like `model.generate`: the
    prompt then n <= max_new_tokens new tokens; rows that finished early are padded with `pad_token_id`.
    `max_cache_len` (static caches: `static_cache` and the compiled decoders) is the number of cache
    slots every step attends over, default T + max_new_tokens (chapter 4 sweeps it);
    `decode_attention` the compiled decoders' attention (`attention_choice`, chapter 5).
    `eos_token_id` defaults to the model's; `pad_token_id` to eos. Sampling (`do_sample`,
    `temperature`, `top_k`) is reproducible: the same `seed`, an int in [0, 2**32), gives the same
    tokens on every decoder; `seed=None` draws one from torch's CPU generator (`torch.manual_seed`
    fixes it). Integer arguments accept any integer-like scalar (numpy ints, 0-d tensors). Bad input
    gets a ValueError or TypeError naming the argument, before anything runs."""
    if not isinstance(decoder, str) or decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
    if pad_token_id is None:
        pad_token_id = eos_token_id if eos_token_id is not None else 0
    gen, attention_mask = _check(model, input_ids, attention_mask, max_new_tokens, max_cache_len,
                                 eos_token_id, pad_token_id, do_sample, temperature, top_k, seed)
    gen = replace(gen, decode_attention=attention_choice(model.dtype, decode_attention))
    if gen.do_sample and seed is None:  # from torch's CPU generator: torch.manual_seed fixes it
        gen = replace(gen, seed=int(torch.randint(0, 2**32, (), dtype=torch.long)))
    # the named range lets a profiler trace tell the decode from the input checks above
    with torch.inference_mode(), torch.profiler.record_function(f"fastgen.{decoder}"):
        return DECODERS[decoder](model, input_ids, attention_mask, gen)


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


def _check(model, input_ids, attention_mask, max_new_tokens, max_cache_len, eos, pad, do_sample,
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
    if T + N > cfg.n_positions:
        raise ValueError(f"prompt ({T}) + max_new_tokens ({N}) = {T + N} exceeds "
                         f"the model's {cfg.n_positions} positions")
    L = _int("max_cache_len", max_cache_len, T + N, cfg.n_positions + 1, none=True)
    if bool((input_ids < 0).any()) or bool((input_ids >= cfg.vocab_size).any()):
        raise ValueError(f"input_ids must lie in [0, {cfg.vocab_size})")
    eos = _int("eos_token_id", eos, 0, cfg.vocab_size, none=True)
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

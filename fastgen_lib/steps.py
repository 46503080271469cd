"""Step backends: how one decode step is computed (`registry.py` pairs each with a stop driver).
`start(model, input_ids, attention_mask, gen, slots)` runs the prompt and chooses its token; then
`step(slot)` launches one more step, which writes the next token into `step.out` and "every row has
finished" into `step.done[slot]`, and never waits for the GPU; `offers(gen)` says what a driver may
rely on (`stops.REPLAYS`). Chapters 1-2, 4 (eager) and 5 (graph).
"""
import contextlib
import functools
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, DynamicCache, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .stops import REPLAYS

MAX_GRAPH_STEPS = 8  # GraphSteps (cache + graphs) kept per model; the least recently used goes first
WARMUP_SLOTS = (0, 1, 0)  # the steps a GraphStep runs before capture: each slot, then one more
MIN_LENGTH = 2 + len(WARMUP_SLOTS)  # a scratch prefill (column 0), its token (1), then one per step


@dataclass(frozen=True)
class GenConfig:
    max_new_tokens: int
    eos_token_id: tuple | int | None  # the ids that finish a row (generate passes a tuple)
    pad_token_id: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    max_cache_len: int | None = None  # static caches: slots to allocate (None: prompt + new tokens)
    decode_attention: str = "one_query"  # GraphStep's attention (ATTENTION)


# --- choosing the next token: shared by every step, never syncs ------------------------------------------

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


def eos_ids(gen):
    """`gen.eos_token_id` as a tuple of ids (empty: no EOS)."""
    e = gen.eos_token_id
    return () if e is None else tuple(e) if isinstance(e, (list, tuple)) else (e,)


class Chooser:
    """The settings of `choose`. Whether to sample, and whether top-k and EOS apply, are fixed per
    Chooser (a compiled step is specialized on them); every value that may change between calls (seed,
    temperature, top-k, EOS, pad) is a 0-d tensor, so a new value recompiles and recaptures nothing."""

    def __init__(self, gen, device):
        self.do_sample, self.use_top_k = gen.do_sample, gen.top_k is not None
        self.use_eos = gen.eos_token_id is not None
        long = functools.partial(torch.zeros, dtype=torch.long, device=device)
        self.seed, self.top_k, self.pad = long(()), long(()), long(())
        self.eos = long(len(eos_ids(gen)))  # [E]: a row finishes on any of them
        self.temperature = torch.ones((), device=device)
        self.set(gen)

    def set(self, gen):
        """This call's values, written in place (a captured graph reads these tensors)."""
        self.seed.fill_(gen.seed)
        self.temperature.fill_(gen.temperature)
        self.top_k.fill_(gen.top_k or 1)
        if eos_ids(gen):  # (a warm-up's scratch settings have none: the tensor keeps its ids)
            self.eos.copy_(torch.tensor(eos_ids(gen), dtype=torch.long))
        self.pad.fill_(gen.pad_token_id)


def choose(logits, finished, step, c):
    """logits [B, V] float32 -> next token [B], with the settings of Chooser `c`. Greedy is argmax;
    sampling is argmax(logits/T + Gumbel), which draws from softmax(logits/T) (top-k first masks all
    but the k largest). Finished rows get the pad token; `finished` [B] bool is updated in place."""
    if c.do_sample:
        logits = logits / c.temperature
        if c.use_top_k:
            top = logits.sort(dim=-1, descending=True).values  # top_k is a tensor: no torch.topk
            kth = top.gather(-1, (c.top_k - 1).expand(logits.shape[0], 1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        logits = logits + gumbel_noise(c.seed, step, logits.shape[0], logits.shape[1], logits.device)
    nxt = torch.argmax(logits, dim=-1)
    nxt = torch.where(finished, c.pad, nxt)
    if c.use_eos:
        # a row finishes on any of its EOS ids (one id: the same elementwise op as ever)
        finished |= (nxt == c.eos) if len(c.eos) == 1 else (nxt[:, None] == c.eos).any(-1)
    return nxt


# --- pieces every step shares ----------------------------------------------------------------------------

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


# --- ch. 1-4: eager steps --------------------------------------------------------------------------------

class EagerStep:
    """Ch. 1-4: one eager forward per step, made anew for every call. `cache` is what the chapter
    changes: None re-runs the whole sequence, DynamicCache grows by one position per step (a new,
    slightly larger allocation per layer: what fragments the caching allocator), StaticCache is
    allocated once at `max_cache_len` slots and every step attends over all of them."""
    cache_class = None

    @classmethod
    def offers(cls, gen):
        """Nothing: a step allocates (two CUDA streams would need record_stream everywhere)."""
        return frozenset()

    @classmethod
    def start(cls, model, input_ids, attention_mask, gen, slots=(0,)):
        return cls(model, input_ids, attention_mask, gen)  # a new one per call

    def __init__(self, model, input_ids, attention_mask, gen):
        B, T = input_ids.shape
        static = self.cache_class is StaticCache
        L = (gen.max_cache_len or T + gen.max_new_tokens) if static else T + gen.max_new_tokens
        dev = input_ids.device
        self.model, self.t, self.n, self.done = model, T, T, [None, None]
        self.out = torch.full((B, T + gen.max_new_tokens), gen.pad_token_id, device=dev)
        self.out[:, :T] = input_ids
        self.mask = torch.ones(B, L, dtype=torch.long, device=dev)  # new tokens and unused slots: 1
        self.mask[:, :T] = attention_mask                          # (the causal mask hides those)
        self.pos = positions(self.mask)
        self.finished = torch.zeros(B, dtype=torch.bool, device=dev)
        self.chooser = Chooser(gen, dev)
        self.cache = (StaticCache(config=model.config, max_cache_len=L) if static
                      else None if self.cache_class is None else DynamicCache(config=model.config))
        mask = self.mask if static else self.mask[:, :T]  # a static cache's mask spans all of it
        self._choose(forward(model, input_ids, mask, self.pos[:, :T], self.cache), 0)  # prefill

    def _choose(self, logits, slot):
        self.out[:, self.n] = choose(logits, self.finished, self.n, self.chooser)
        self.done[slot] = self.finished.all()

    def __call__(self, slot=0):
        n = self.n
        if self.cache is None:  # no cache: the whole sequence again
            logits = forward(self.model, self.out[:, : n + 1], self.mask[:, : n + 1],
                             self.pos[:, : n + 1])
        else:  # one token; a static cache's mask spans all its slots
            mask = self.mask if self.cache_class is StaticCache else self.mask[:, : n + 1]
            logits = forward(self.model, self.out[:, n : n + 1], mask, self.pos[:, n : n + 1],
                             self.cache)
        self.n += 1
        self._choose(logits, slot)

    def tokens(self, n):
        """The prompt and the first `n` new tokens [B, T + n] (this call's own buffer)."""
        return self.out[:, : self.t + n]


class NaiveStep(EagerStep):
    """Ch. 1: no cache. Step i re-runs all T+i tokens, so N tokens cost O(N^2)."""


class DynamicStep(EagerStep):
    """Ch. 2: a DynamicCache; keys and values grow by one position per step."""
    cache_class = DynamicCache


class StaticStep(EagerStep):
    """Ch. 4: a StaticCache of `max_cache_len` slots (default: the final length T+N), allocated once
    per call: fixed shapes, at the price of attention over the unused slots."""
    cache_class = StaticCache


# --- ch. 5: one compiled step, replayed ------------------------------------------------------------------

def decode_step(model, cache, chooser, tok, step_pos, mask, col, finished, out, done):
    """One whole decode step, the function that is compiled: forward on `tok` [B, 1],
    choose the next token, write it into `out` [B, L] at column `col` and into `tok`,
    advance the position, and set `done` (0-d: "all rows finished"). Only in-place
    writes, so it replays as a CUDA graph."""
    col += 1
    logits = forward(model, tok, mask, step_pos, cache)
    nxt = choose(logits, finished, col, chooser)
    out.index_copy_(1, col.view(1), nxt[:, None])
    tok.copy_(nxt[:, None])
    step_pos += 1
    done.copy_(finished.all())


def one_query_attention(module, query, key, value, attention_mask, scaling=None,
                        dropout=0.0, **kwargs):
    """Attention for a decode step (one query token) as plain tensor math, which
    torch.compile fuses into a few small reductions. Shapes: query [B, H, 1, D],
    key/value [B, H, S, D] (the whole static cache), attention_mask bool [B, 1, 1, S]
    (True = attend). Returns [B, 1, H, D], like transformers' kernels. Longer queries
    (the prefill) go to SDPA."""
    if query.shape[2] != 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (query.float() * key.float()).sum(-1) * scaling                 # [B, H, S]
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask[:, :, 0], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights[..., None] * value.float()).sum(-2)                       # [B, H, D]
    return out.to(value.dtype)[:, None], None


def grouped_one_query_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                **kwargs):
    """`one_query_attention` for grouped-query and multi-query attention (Llama, Qwen2, Mistral):
    key/value [B, Hkv, S, D] with Hkv < H, each key/value head serving G = H / Hkv query heads. The
    query heads fold into [B, Hkv, G], so the cache is read once, never repeated per head."""
    B, H, Tq, D = query.shape
    Hkv = key.shape[1]
    if Hkv == H or Tq != 1 or dropout:
        return one_query_attention(module, query, key, value, attention_mask, scaling=scaling,
                                   dropout=dropout, **kwargs)
    scaling = D ** -0.5 if scaling is None else scaling
    q = query.float().view(B, Hkv, H // Hkv, 1, D)                             # [B, Hkv, G, 1, D]
    scores = (q * key.float()[:, :, None]).sum(-1) * scaling                   # [B, Hkv, G, S]
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask[:, :, :1], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights[..., None] * value.float()[:, :, None]).sum(-2)             # [B, Hkv, G, D]
    return out.reshape(B, H, D).to(value.dtype)[:, None], None


ATTENTION = {"one_query": "fastgen_one_query", "sdpa": "sdpa", "math": "sdpa"}


def attention_choice(dtype=torch.float32, choice="auto"):
    """GraphStep's attention, `generate(decode_attention=...)`: `one_query` (ours), `sdpa`
    (PyTorch's fused kernel, as `model.generate`), `math` (SDPA's unfused path) or `auto`: `one_query`
    in float32, else `sdpa`. Measured on the H200 (chapter 5): in float32, SDPA spent 18 us per layer on
    one query token and `one_query` is faster; in bfloat16 SDPA's flash kernel wins."""
    if not isinstance(choice, str) or (choice != "auto" and choice not in ATTENTION):
        raise ValueError(f"decode_attention={choice!r}: expected 'auto' or one of {sorted(ATTENTION)}")
    return ("one_query" if dtype == torch.float32 else "sdpa") if choice == "auto" else choice


@contextlib.contextmanager
def decode_attention(model, choice):
    """The model runs attention `choice` (one of ATTENTION) inside this block, through transformers'
    public `set_attn_implementation`, and its own again after (not thread-safe: one model, one
    decode at a time). GraphStep uses it while it compiles and captures (and, off CUDA, on every
    step); the eager steps and `model.generate` keep the model's own. A model on eager or flash
    attention keeps it, as does one whose attention transformers cannot switch (no
    AttentionInterface: Falcon, Bloom, GPT-J, CodeGen). `one_query` is registered with
    transformers here, on first use."""
    saved = model.config._attn_implementation
    switchable = getattr(model, "_can_set_attn_implementation", lambda: True)()
    if saved not in ("sdpa", ATTENTION["one_query"]) or not switchable:
        yield
        return
    if ATTENTION["one_query"] not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(ATTENTION["one_query"], grouped_one_query_attention)
        AttentionMaskInterface.register(ATTENTION["one_query"], sdpa_mask)  # SDPA's boolean mask
    model.set_attn_implementation(ATTENTION[choice])
    try:
        with sdpa_kernel([SDPBackend.MATH]) if choice == "math" else contextlib.nullcontext():
            yield
    finally:
        model.set_attn_implementation(saved)


@contextlib.contextmanager
def quiet_compile():
    """Silence inductor's two pieces of advice at compile time, which are not about correctness:
    TF32 (the book keeps float32 matmuls exact, so the tokens equal `model.generate`'s) and "online
    softmax disabled" (a note about its own reduction strategy). Other warnings still show."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
        warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled")
        yield


@functools.cache
def compiled_decode_step():
    """`decode_step` under torch.compile, made on first use, one per process (dynamo
    keeps its compiled code per Python function). dynamic=True: sizes are symbolic, so
    most new batch sizes and cache lengths reuse a compile (dynamo still specializes
    sizes 0 and 1)."""
    return torch.compile(decode_step, fullgraph=True, dynamic=True)


def weights_key(model):
    """The addresses of the weight tensors, which a captured graph reads: a weight replaced by another
    tensor (`set_eos_bias`, `load_state_dict(assign=True)`, `model.to(...)`) changes it. A weight
    updated in place keeps its address, and the graphs read the new values."""
    return tuple(p.data_ptr() for p in model.parameters())


class GraphStep:
    """Ch. 5: the StaticCache and the step's buffers, allocated once, `decode_step` compiled and, on
    CUDA, captured as one CUDA graph per flag slot; a step is one replay. Built once per (weights,
    batch, cache length, settings) and kept on the model: `decoders.reset(model)` frees them.
    A step is self-contained on the device: it reads `tok`/`step_pos`, writes the next token into
    `out` and `tok`, and sets `done[slot]`, so the host only launches it."""

    @classmethod
    def offers(cls, gen):
        return frozenset({REPLAYS})  # allocates nothing during a step: safe on any stream

    @classmethod
    def start(cls, model, input_ids, attention_mask, gen, slots=(0,)):
        """The model's GraphStep for this batch, cache length and settings (made, compiled and
        captured for `slots` the first time), with the prompt prefilled. The cache has
        `max_cache_len` slots (default T+N), at least MIN_LENGTH (the warm-up's steps need them)."""
        kept = model.__dict__.setdefault("_fastgen_steps", OrderedDict())
        B, T = input_ids.shape
        L = max(gen.max_cache_len or T + gen.max_new_tokens, MIN_LENGTH)
        weights = weights_key(model)
        for k in [k for k in kept if k[0] != weights]:  # graphs that read replaced weights: freed
            del kept[k]
        key = (weights, cls, B, L, gen.do_sample, gen.top_k is not None,
               len(eos_ids(gen)), model.dtype, str(model.device), gen.decode_attention)
        if key not in kept:
            while len(kept) >= MAX_GRAPH_STEPS:
                kept.popitem(last=False)
            kept[key] = cls(model, B, L, gen)
        kept.move_to_end(key)
        step = kept[key]
        try:
            step.warm_up(slots)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # e.g. GPT-J's attention
            kind = getattr(model.config, "model_type", type(model).__name__)
            why = (str(e).splitlines()[1:2] or [str(e)])[0][:160]
            raise ValueError(f"{kind}: torch.compile cannot compile its decode step ({why}); "
                             "the eager decoders (naive, kv_cache, static_cache) run it") from e
        step.prefill(input_ids, attention_mask, gen)
        return step

    def __init__(self, model, batch, length, gen):
        dev = model.device
        self.model, self.attention, self.cuda = model, gen.decode_attention, dev.type == "cuda"
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.out = torch.zeros(batch, length, dtype=torch.long, device=dev)   # prompt + new tokens
        self.mask = torch.ones(batch, length, dtype=torch.long, device=dev)   # spans the whole cache
        self.pos = torch.zeros(batch, length, dtype=torch.long, device=dev)   # position ids, all columns
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)        # the token fed next
        self.step_pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)   # its position id
        self.col = torch.zeros((), dtype=torch.long, device=dev)              # its column in `out`
        self.finished = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.done = torch.zeros(2, dtype=torch.bool, device=dev).unbind()     # "all finished", per slot
        self.chooser = Chooser(gen, dev)
        self.graphs, self.compile_s = {}, None

    def prefill(self, input_ids, attention_mask, gen):
        """Eager prefill of a new request into the reused buffers (in place: graph addresses stay valid)."""
        T = input_ids.shape[1]
        self.t = T
        self.chooser.set(gen)
        self.cache.reset()  # zeroes K/V and the cache's write position
        self.mask[:, :T] = attention_mask
        self.mask[:, T:] = 1
        self.pos.copy_(positions(self.mask))
        self.out.fill_(gen.pad_token_id)
        self.out[:, :T] = input_ids
        self.finished.zero_()
        self.col.fill_(T)
        logits = forward(self.model, input_ids, self.mask, self.pos[:, :T], self.cache)
        nxt = choose(logits, self.finished, self.col, self.chooser)
        self.out[:, T] = nxt
        self.tok.copy_(nxt[:, None])
        self.step_pos.copy_(self.pos[:, T : T + 1])
        self.done[0].copy_(self.finished.all())

    @quiet_compile()
    def warm_up(self, slots=(0,)):
        """Compile `decode_step` (if new) and run it, then on CUDA capture a graph for each of `slots`
        not captured yet. The steps run on a scratch prefill of one token, so they write columns 1-4
        whatever the request: never past the buffers, even for max_new_tokens=1. The caller prefills
        again for real. `compile_s`: the seconds the first warm-up took."""
        if self.compile_s is not None and (not self.cuda or all(s in self.graphs for s in slots)):
            return
        t0 = time.perf_counter()
        B, dev = self.out.shape[0], self.out.device
        scratch = torch.ones(B, 1, dtype=torch.long, device=dev)
        self.prefill(scratch - 1, scratch, GenConfig(0, None, 0))
        if self.compile_s is None and not self.cuda:
            self.run(0)
        elif self.compile_s is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for slot in WARMUP_SLOTS:  # both slots compiled; lazy init done before capture
                    self.run(slot)
            torch.cuda.current_stream().wait_stream(side)
        for slot in slots if self.cuda else ():
            if slot not in self.graphs:  # capture records the launches; it runs nothing
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    self.run(slot)
                self.graphs[slot] = g
        if self.cuda:
            torch.cuda.synchronize()
        if self.compile_s is None:
            self.compile_s = time.perf_counter() - t0

    def run(self, slot):
        """`decode_step` through torch.compile, with this step's attention (recompile
        limit raised here: every dtype, sampling setting or lm_head bias is one more
        compile of the same function)."""
        with decode_attention(self.model, self.attention), \
                torch._dynamo.config.patch(recompile_limit=64):
            compiled_decode_step()(self.model, self.cache, self.chooser, self.tok,
                                   self.step_pos, self.mask, self.col, self.finished,
                                   self.out, self.done[slot])

    def __call__(self, slot=0):
        """Launch one decode step on the current stream (a graph replay on CUDA); never waits."""
        if self.cuda:
            self.graphs[slot].replay()
        else:
            self.run(slot)

    def tokens(self, n):
        """The prompt and the first `n` new tokens [B, T + n], copied: the buffers are reused."""
        return self.out[:, : self.t + n].clone()

"""GPT-2's decode step from the kernels (`fused_forward`), the step on the seam
(`fused_decode_step`) and its backend, `FusedStep`."""
import torch
import triton

from ..steps import GraphStep, choose
from ..stops import LOOP_BODY
from .fold import fold_layernorms, step_weights
from .kernels import attention, attention_proj, gemv, greedy_tail
from .tiles import INTERPRET, LOCKS, attention_blocks, gemv_tiles, head_tiles, layer_tiles, \
    scratch_size


class Buffers:
    """What a fused step writes besides the cache, made once per (model, batch, cache length): the
    residual stream h [B, E], q and the attention output [B, E], the MLP's hidden [B, 4E], the
    logits [B, V] float32 and their per-tile maxima, the scratch of the split kernels (partial
    sums, counters), and at batch > 1 h's sums for the LayerNorms (`stats`: None at batch 1, or
    where the two GEMVs that write h have different column tiles). One `stats` serves every layer:
    a GEMV writes it only after its wait, when the GEMV that read it last has finished."""

    def __init__(self, model, batch, length):
        E, V, H = model.config.n_embd, model.config.vocab_size, model.config.n_head
        dev, dt = model.device, model.dtype
        self.h, self.q, self.a = (torch.empty(batch, E, dtype=dt, device=dev) for _ in range(3))
        self.m = torch.empty(batch, 4 * E, dtype=dt, device=dev)
        self.logits = torch.empty(batch, V, dtype=torch.float32, device=dev)
        head = head_tiles(batch, dt)
        tiles = triton.cdiv(V, gemv_tiles(batch, E, V, dev, dtype=dt, **head)[1])  # lm_head's
        self.top = torch.empty(batch, tiles, dtype=torch.float32, device=dev)
        self.top_i = torch.empty(batch, tiles, dtype=torch.int32, device=dev)

        def own(K, N):  # the tiles `fused_forward` gives gemv for x @ W [K, N] (no warps)
            return {k: v for k, v in layer_tiles(batch, K, N, dt).items() if k != "num_warps"}
        tiles = {triton.cdiv(E, gemv_tiles(batch, K, E, dev, dtype=dt, **own(K, E))[1])
                 for K in (E, 4 * E)}  # column tiles of the two GEMVs that write h
        self.stats = (torch.empty(tiles.pop(), batch, 2, device=dev)
                      if batch > 1 and len(tiles) == 1 else None)
        need = max(scratch_size(batch, K, N, dev, dtype=dt, **own(K, N))  # the layer GEMVs'
                   for K, N in ((E, 3 * E), (E, E), (E, 4 * E), (4 * E, E)))
        need = max(need, scratch_size(batch, E, V, dev, dtype=dt, **head))
        splits = attention_blocks(length)[1]
        need = max(need, batch * H * splits * (triton.next_power_of_2(E // H) + 2), H * batch * E)
        self.scratch = (torch.empty(need, dtype=torch.float32, device=dev),
                        torch.zeros(LOCKS, dtype=torch.int32, device=dev))


@torch.no_grad()
def fused_forward(model, folds, buf, tok, step_pos, mask, cache, col, pdl=False,
                  weights=None):
    """One decode step of GPT2LMHeadModel with the fused kernels: tok [B, 1] token ids
    at column `col` (0-d tensor), step_pos [B, 1] their position ids, mask [B, L] the
    attention mask over all L slots of the prefilled StaticCache `cache`; `folds` from
    `fold_layernorms`, `buf` a Buffers. Writes the step's keys and values at column
    `col` -> float32 logits [B, V] (buf.logits), equal to
    `steps.forward(model, tok, mask, step_pos, cache)`, and their per-tile maxima
    (buf.top, buf.top_i). The cache's own counters are not advanced: `col` is the step's
    column. pdl=True: each kernel after the first starts as the one ahead finishes.
    weights: `step_weights` (None: the model's own)."""
    tr = model.transformer
    h, q, a, m, stats = buf.h, buf.q, buf.a, buf.m, buf.stats
    kw = dict(scratch=buf.scratch, pdl=pdl)

    def tiles(w):  # a layer GEMV's tiles for x @ w
        return layer_tiles(h.shape[0], *w.shape, w.dtype)
    embed = (tr.wte.weight, tr.wpe.weight, tok, step_pos)  # layer 0's input, into h
    h_stats = None  # h's sums, by the GEMV that wrote h (layer 0: c_attn sums it)
    weights = weights or step_weights(model, k_contiguous=False)  # the model's own
    for block, layer, (ln_1, ln_2), (w_qkv, w_fc, w_proj) in zip(tr.h, cache.layers,
                                                                  folds[0], weights):
        at, mlp = block.attn, block.mlp
        gemv(h, w_qkv, at.c_attn.bias, ln=ln_1, ln_stats=h_stats, embed=embed, out=q,
             qkv=(layer.keys, layer.values, col), **kw, **tiles(w_qkv))  # q [B, E]
        embed = None
        if h.shape[0] == 1:  # one kernel: each head's output is a slice of c_proj's K
            attention_proj(q, layer.keys, layer.values, mask, col, at.c_proj.weight,
                           at.c_proj.bias, h, out=h, **kw)
        else:
            attention(q, layer.keys, layer.values, mask, col, out=a, early_kv=True,
                      **kw)
            gemv(a, at.c_proj.weight, at.c_proj.bias, residual=h, out=h,
                 stats_out=stats, **kw, **tiles(at.c_proj.weight))
        gemv(h, w_fc, mlp.c_fc.bias, ln=ln_2, ln_stats=stats, gelu=True, out=m, **kw,
             **tiles(w_fc))
        gemv(m, w_proj, mlp.c_proj.bias, residual=h, out=h, stats_out=stats, **kw,
             **tiles(w_proj))
        h_stats = stats
    lm_head = model.lm_head.weight.t()                                  # [E, V] view
    return gemv(h, lm_head, folds[1][2], ln=folds[1], ln_stats=stats, out=buf.logits,
                argmax=(buf.top, buf.top_i), **kw,
                **head_tiles(h.shape[0], lm_head.dtype))


def fused_decode_step(model, folds, buf, cache, chooser, tok, step_pos, mask, col, finished,
                      out, done, pdl=False, weights=None):
    """`steps.decode_step` with `fused_forward` in place of the model's forward: the next token into
    `out` at column col + 1 and into `tok`, the position and the column advanced, `done` set. Greedy
    decoding chooses in one kernel (`greedy_tail`); sampling through `steps.choose`. In place only,
    so it replays as a CUDA graph. weights: as `fused_forward`'s."""
    logits = fused_forward(model, folds, buf, tok, step_pos, mask, cache, col, pdl, weights)
    if not chooser.do_sample:
        return greedy_tail(logits, finished, chooser, out, tok, step_pos, col, done, buf.scratch[1],
                           tiles=(buf.top, buf.top_i), pdl=pdl)
    col += 1
    nxt = choose(logits, finished, col, chooser)
    out.index_copy_(1, col.view(1), nxt[:, None])
    tok.copy_(nxt[:, None])
    step_pos += 1
    done.copy_(finished.all())


def weights_version(model):
    """Each weight's in-place write count (`Tensor._version`): it changes when a weight is updated
    in place, which `steps.weights_key` (addresses) does not see."""
    return tuple(p._version for p in model.parameters())


def supports_pdl(device):
    """Whether kernels on `device` can be launched as programmatic dependent launches: a CUDA GPU
    of compute capability 9.0 or later (Hopper), not Triton's interpreter."""
    return (device.type == "cuda" and not INTERPRET
            and torch.cuda.get_device_capability(device)[0] >= 9)


class FusedStep(GraphStep):
    """A GraphStep whose step is `fused_decode_step`: the same buffers, StaticCache, eager prefill,
    warm-up and one CUDA graph per flag slot; any stop driver runs it. GPT-2 only (GPT2LMHeadModel).
    pdl: the kernels as programmatic dependent launches; None: where the GPU has them."""

    pdl = None

    @classmethod
    def offers(cls, gen):  # sampling's torch ops allocate as they are captured
        return super().offers(gen) | (set() if gen.do_sample else {LOOP_BODY})

    def __init__(self, model, batch, length, gen):
        cfg = model.config
        if getattr(cfg, "model_type", None) != "gpt2":
            raise ValueError(f"the fused step runs GPT-2 (GPT2LMHeadModel), not "
                             f"{getattr(cfg, 'model_type', type(model).__name__)}")
        if cfg.activation_function != "gelu_new" or cfg.scale_attn_by_inverse_layer_idx \
                or not cfg.scale_attn_weights:
            raise ValueError("the fused step runs GPT-2's own settings (gelu_new, attention "
                             "scaled by 1/sqrt(head size))")
        if model.device.type != "cuda" and not INTERPRET:
            raise ValueError("the fused step needs a CUDA GPU with Triton (on a CPU, only under "
                             "Triton's interpreter: TRITON_INTERPRET=1 before triton is imported)")
        super().__init__(model, batch, length, gen)
        self.folds, self.versions = fold_layernorms(model), weights_version(model)
        self.weights = step_weights(model, k_contiguous=batch == 1)
        self.buf = Buffers(model, batch, length)
        self.pdl = supports_pdl(model.device) if self.pdl is None else self.pdl

    def prefill(self, input_ids, attention_mask, gen):
        """GraphStep's prefill, after folding again if a weight changed in place since the folds
        were made (e.g. `lm_head.bias[EOS] = ...`): the folds are copies, not the weights."""
        if weights_version(self.model) != self.versions:
            fold_layernorms(self.model, out=self.folds)
            step_weights(self.model, self.tok.shape[0] == 1, out=self.weights)
            self.versions = weights_version(self.model)
        super().prefill(input_ids, attention_mask, gen)

    def run(self, slot):
        fused_decode_step(self.model, self.folds, self.buf, self.cache, self.chooser, self.tok,
                          self.step_pos, self.mask, self.col, self.finished, self.out,
                          self.done[slot], self.pdl, self.weights)

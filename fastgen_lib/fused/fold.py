"""LayerNorm folded into the GEMV after it, with mean mu, 1/std r, weight g, bias beta: LN(x) @ W
+ b = r * (sum_k x_k g_k W_kn - mu * c_n) + d_n, where c = g @ W and d = beta @ W + b are computed
once per model (no pass over x before the GEMV); and the weights as the step's GEMVs read them."""


def fold_layernorm(ln, weight, bias=None):
    """(g, c, d, eps) for `gemv(..., ln=...)`: LayerNorm module `ln` before
    x @ weight [K, N] + bias: c = g @ weight, d = beta @ weight + bias, in float32."""
    w = weight.float()
    c = ln.weight.float() @ w
    d = ln.bias.float() @ w + (bias.float() if bias is not None else 0.0)
    return ln.weight, c.contiguous(), d.contiguous(), ln.eps


def fold_layernorms(model, out=None):
    """Every LayerNorm of GPT2LMHeadModel `model` folded into the GEMV after it: per block (ln_1
    into c_attn, ln_2 into c_fc), then ln_f into lm_head (with its bias, if `set_eos_bias` gave it
    one). Made once per step, and again when a weight changes in place: then into the tensors of
    `out`, the earlier folds, whose addresses the captured graphs read."""
    tr = model.transformer
    folds = [(fold_layernorm(b.ln_1, b.attn.c_attn.weight, b.attn.c_attn.bias),
              fold_layernorm(b.ln_2, b.mlp.c_fc.weight, b.mlp.c_fc.bias)) for b in tr.h]
    folds = folds, fold_layernorm(tr.ln_f, model.lm_head.weight.t(), model.lm_head.bias)
    if out is not None:
        for new, old in zip(_each(folds), _each(out)):
            old[1].copy_(new[1])  # c
            old[2].copy_(new[2])  # d
        return out
    return folds


def _each(folds):
    """The folds of `fold_layernorms`, one after another."""
    return [f for pair in folds[0] for f in pair] + [folds[1]]


def step_weights(model, k_contiguous, out=None):
    """Per block, the weights [K, N] of c_attn, c_fc and mlp.c_proj as the step's
    GEMVs read them. k_contiguous=True (the step at batch 1): copies with K
    contiguous (strides (1, K), as the lm_head's [V, E] is read). A program of a
    few columns then reads whole memory sectors, so a projection can have many
    programs with few bytes each (`layer_tiles`); GPT-2's Conv1D keeps N
    contiguous, where 8 bfloat16 columns use half of each 32-byte sector. The
    copies take as much memory as those weights. False (at batch > 1, where
    tl.dot reads them faster as they are): the model's own tensors. `out`: the
    earlier copies, written again in place (their addresses are in the captured
    graphs)."""
    blocks = [(b.attn.c_attn.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)
              for b in model.transformer.h]
    if not k_contiguous:
        return blocks
    if out is not None:
        for new, old in zip(blocks, out):
            for w, copy in zip(new, old):
                copy.copy_(w)
        return out
    return [tuple(w.t().contiguous().t() for w in ws) for ws in blocks]


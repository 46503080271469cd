"""Token-equality checks against `model.generate`, shared by the tests, the benchmark and the notebooks.
Where two correct programs disagree, `first_divergence` shows why: the top-2 logit gap at that step."""
import torch

from .registry import METHODS

# Which `model.generate` call each decoder must reproduce token for token (like with like).
HF_REFERENCE = {n: m.reference for n, m in METHODS.items() if m.step}


def hf_generate(model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **kwargs):
    """`model.generate` under greedy decoding, with our arguments (its static cache compiles itself on
    CUDA: inductor's advice is silenced as in our own compile, `steps.quiet_compile`)."""
    from .steps import quiet_compile
    with torch.inference_mode(), quiet_compile():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                              max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                              pad_token_id=pad_token_id, **kwargs)


def first_divergence(model, input_ids, attention_mask, ref, out):
    """None if `out` equals `ref`, else a dict: the first (row, column) where they differ and the top-2
    logit gap of the reference model at that step (a gap near float rounding means a near-tie decided it)."""
    if out.shape == ref.shape and torch.equal(out, ref):
        return None
    n = min(out.shape[1], ref.shape[1])
    diff = (out[:, :n] != ref[:, :n]).nonzero()
    if len(diff) == 0:
        return {"row": None, "col": n, "why": f"lengths differ: {tuple(out.shape)} vs {tuple(ref.shape)}"}
    row, col = diff[0].tolist()
    T = input_ids.shape[1]
    mask = torch.cat([attention_mask[row : row + 1],
                      attention_mask.new_ones(1, col - T)], dim=1)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.inference_mode():
        logits = model(input_ids=ref[row : row + 1, :col], attention_mask=mask, position_ids=pos).logits[0, -1]
    top2 = logits.float().topk(2)
    return {"row": row, "col": col, "ref_token": int(ref[row, col]), "out_token": int(out[row, col]),
            "top2_gap": float(top2.values[0] - top2.values[1])}

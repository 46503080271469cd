"""Issue 14: GPT-2's MLP in one Triton kernel instead of two GEMVs. An experiment, kept out of
the library because it measured slower (results/h200/fused/mlp/).

At batch 1 each of the fused step's GEMVs costs about 5 µs for 1-2 µs of bytes. One kernel for
the MLP's pair saves a launch, a wait for the kernel ahead and the round trip of the hidden
[B, 4E] through memory, and it reads both of its weight slices before it waits. Each program
takes block_j hidden units: LN(x) @ W_fc[:, j], GELU, then their share of the output,
m_j @ W_proj[j, :]. Those partial sums [E] must then be added up across all programs, and only
the last program to finish knows that they are all there: here the last of each group of
programs adds its group's, the last group adds the groups'. Our reading of the result: those
two sums are several dependent trips through L2 on the step's critical path, where each GEMV's
split-K sum is one, and they cost more than the kernel saves.

The probe: `fused.FusedStep` (two GEMVs per MLP) against steps whose MLPs run this kernel at
several (block_j, group, warps), under the interleaved driver, prompt 16 mixed, 100 new tokens:
ms per step (`measure.measure_calls`, alternated, 10 rounds), tokens against model.generate.
Usage: python tools/probe_mlp.py OUT_DIR [float32|bfloat16] [batch]
tests/test_probe_mlp.py tests the kernel against PyTorch (on a CPU under Triton's interpreter)."""
import pathlib
import sys

import torch
import triton
import triton.language as tl

from fastgen_lib.fused import SQRT_2_OVER_PI, FusedStep, attention, gemv, greedy_tail

@triton.jit
def _mlp_kernel(x_ptr, wf_ptr, wp_ptr, g_ptr, c_ptr, d_ptr, bp_ptr, part_ptr, lock_ptr,
                E, F, eps, stride_xb, stride_fk, stride_fn, stride_pk, stride_pn,
                BLOCK_J: tl.constexpr, BLOCK_E: tl.constexpr, GROUP: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    # x [B, E] += GELU(LN(x) @ Wf [E, F] + bf) @ Wp [F, E] + bp, one row per program column.
    # Program (j, b): hidden units j*BLOCK_J.. of row b. It computes them (all of x, its BLOCK_J
    # columns of Wf), then their share of the output (BLOCK_J rows of Wp): partial sums [E], added
    # up in two levels (the last program of each GROUP, then the last group), in a fixed order.
    pid = tl.program_id(0)
    b = tl.program_id(1)
    P = tl.num_programs(0)
    js = pid * BLOCK_J + tl.arange(0, BLOCK_J)                          # [BLOCK_J]
    j_ok = js < F
    es = tl.arange(0, BLOCK_E)                                          # [BLOCK_E]
    e_ok = es < E
    w_ok = e_ok[:, None] & j_ok[None, :]
    # both weight slices, read while the kernel ahead may still run (with PDL)
    wf = tl.load(wf_ptr + es[:, None] * stride_fk + js[None, :] * stride_fn, mask=w_ok, other=0.0)
    wp = tl.load(wp_ptr + js[None, :] * stride_pk + es[:, None] * stride_pn, mask=w_ok, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + b * stride_xb + es, mask=e_ok, other=0.0).to(tl.float32)   # [BLOCK_E]
    mean = tl.sum(x, axis=0) / E                  # LayerNorm folded in, as gemv(ln=...) does
    rstd = 1.0 / tl.sqrt(tl.maximum(tl.sum(x * x, axis=0) / E - mean * mean, 0.0) + eps)
    xg = (x * tl.load(g_ptr + es, mask=e_ok, other=0.0).to(tl.float32)).to(wf.dtype)
    m = tl.sum(xg.to(tl.float32)[:, None] * wf.to(tl.float32), axis=0)  # [BLOCK_J]
    c = tl.load(c_ptr + js, mask=j_ok, other=0.0)
    m = rstd * (m - mean * c) + tl.load(d_ptr + js, mask=j_ok, other=0.0)
    m = m * tl.sigmoid(2.0 * SQRT_2_OVER_PI * (m + 0.044715 * m * m * m))  # gelu_new
    m = m.to(wf.dtype).to(tl.float32)            # rounded as the hidden [B, F] would be stored
    y = tl.sum(m[None, :] * wp.to(tl.float32), axis=1)                  # [BLOCK_E]
    # the partial sums, added up in two levels (fixed orders): the last program of each group of
    # GROUP programs sums the group's; the last group to finish sums the groups', adds the bias
    # and the residual
    q = pid // GROUP
    n_q = tl.cdiv(P, GROUP)
    part = part_ptr + (b * P + pid) * BLOCK_E
    groups = part_ptr + (tl.num_programs(1) * P + b * BLOCK_Q) * BLOCK_E   # [BLOCK_Q, BLOCK_E]
    locks = lock_ptr + b * (BLOCK_Q + 1)
    tl.store(part + es, y)
    tl.debug_barrier()  # every thread's store is issued before the counter moves
    if tl.atomic_add(locks + q, 1, sem="acq_rel") == tl.minimum(GROUP, P - q * GROUP) - 1:
        first = part_ptr + (b * P + q * GROUP) * BLOCK_E
        gs = tl.arange(0, GROUP)
        g_ok = q * GROUP + gs < P
        for e0 in range(0, E, BLOCK_T):
            ec = e0 + tl.arange(0, BLOCK_T)
            ys = tl.load(first + gs[:, None] * BLOCK_E + ec[None, :], mask=g_ok[:, None],
                         other=0.0, cache_modifier=".cg")              # [GROUP, BLOCK_T]
            tl.store(groups + q * BLOCK_E + ec, tl.sum(ys, axis=0))
        tl.atomic_xchg(locks + q, 0)
        tl.debug_barrier()
        if tl.atomic_add(locks + BLOCK_Q, 1, sem="acq_rel") == n_q - 1:
            qs = tl.arange(0, BLOCK_Q)
            for e0 in range(0, E, BLOCK_T):
                ec = e0 + tl.arange(0, BLOCK_T)
                ec_ok = ec < E
                ys = tl.load(groups + qs[:, None] * BLOCK_E + ec[None, :],
                             mask=(qs < n_q)[:, None], other=0.0, cache_modifier=".cg")
                s = tl.sum(ys, axis=0) + tl.load(bp_ptr + ec, mask=ec_ok, other=0.0).to(tl.float32)
                r = tl.load(x_ptr + b * stride_xb + ec, mask=ec_ok, other=0.0).to(tl.float32)
                tl.store(x_ptr + b * stride_xb + ec, (s + r).to(x_ptr.dtype.element_ty),
                         mask=ec_ok)
            tl.atomic_xchg(locks + BLOCK_Q, 0)


def mlp_blocks(F, block_j=16, group=16):
    """(block_j, programs, group, groups): hidden units per program and programs per row for a
    hidden size F, programs per group of the first sum and the groups' power of 2."""
    assert block_j == triton.next_power_of_2(block_j) and group == triton.next_power_of_2(group)
    programs = triton.cdiv(F, block_j)
    group = min(group, triton.next_power_of_2(programs))
    return block_j, programs, group, triton.next_power_of_2(triton.cdiv(programs, group))


def mlp_scratch(B, E, F, block_j=16, group=16):
    """(floats, counters) of scratch that `mlp` needs for B rows, width E, hidden size F."""
    _, programs, _, groups = mlp_blocks(F, block_j, group)
    return B * (programs + groups) * triton.next_power_of_2(E), B * (groups + 1)


def mlp(x, fc_weight, proj_weight, proj_bias, ln, scratch=None, block_j=16, group=16,
        num_warps=4, pdl=False):
    """GPT-2's MLP with its residual, in place, in one kernel: x [B, E] += GELU(LN(x) @ fc_weight
    [E, F] + fc bias) @ proj_weight [F, E] + proj_bias. ln=(g, c, d, eps) from `fold_layernorm`
    (ln_2 into c_fc: d carries c_fc's bias). Each program holds block_j hidden units, both weight
    slices in registers; their partial sums are added up by the last of each `group` programs,
    then by the last group. scratch=(partials, locks): float32 and int32 zeros of `mlp_scratch`'s
    sizes, as `gemv`'s. pdl: as `gemv`'s. Returns x."""
    B, E = x.shape
    F = fc_weight.shape[1]
    assert fc_weight.shape == (E, F) and proj_weight.shape == (F, E) and proj_bias.shape == (E,)
    assert x.stride(-1) == 1 and proj_bias.is_contiguous()
    g, c, d, eps = ln
    block_j, programs, group, groups = mlp_blocks(F, block_j, group)
    floats, counters = mlp_scratch(B, E, F, block_j, group)
    if scratch is None:
        scratch = (torch.empty(floats, device=x.device),
                   torch.zeros(counters, dtype=torch.int32, device=x.device))
    assert scratch[0].numel() >= floats and scratch[1].numel() >= counters
    block_e = triton.next_power_of_2(E)
    _mlp_kernel[(programs, B)](
        x, fc_weight, proj_weight, g, c, d, proj_bias, *scratch, E, F, eps, x.stride(0),
        fc_weight.stride(0), fc_weight.stride(1), proj_weight.stride(0), proj_weight.stride(1),
        BLOCK_J=block_j, BLOCK_E=block_e, GROUP=group, BLOCK_Q=groups,
        BLOCK_T=min(256, block_e), PDL=pdl, num_warps=num_warps,
        **({"launch_pdl": True} if pdl else {}))
    return x


@torch.no_grad()
def mlp_forward(model, folds, buf, tok, step_pos, mask, cache, col, pdl, tiles, scratch):
    """`fused.fused_forward` with each MLP as one `mlp` kernel: tiles=(block_j, group, warps),
    scratch its own (`mlp_scratch`)."""
    tr = model.transformer
    h, q, a = buf.h, buf.q, buf.a
    kw = dict(scratch=buf.scratch, pdl=pdl)
    embed = (tr.wte.weight, tr.wpe.weight, tok, step_pos)
    for block, layer, (ln_1, ln_2) in zip(tr.h, cache.layers, folds[0]):
        at, fc, proj = block.attn, block.mlp.c_fc, block.mlp.c_proj
        gemv(h, at.c_attn.weight, at.c_attn.bias, ln=ln_1, embed=embed, out=q,
             qkv=(layer.keys, layer.values, col), **kw)
        embed = None
        attention(q, layer.keys, layer.values, mask, col, out=a, **kw)
        gemv(a, at.c_proj.weight, at.c_proj.bias, residual=h, out=h, **kw)
        mlp(h, fc.weight, proj.weight, proj.bias, ln_2, scratch, *tiles, pdl=pdl)
    return gemv(h, model.lm_head.weight.t(), folds[1][2], ln=folds[1], out=buf.logits,
                argmax=(buf.top, buf.top_i), **kw)


def mlp_step(block_j, group, warps):
    """A FusedStep whose MLPs run `mlp` with these tiles (greedy decoding)."""

    class MLPStep(FusedStep):
        def __init__(self, model, batch, length, gen):
            super().__init__(model, batch, length, gen)
            E = model.config.n_embd
            floats, counters = mlp_scratch(batch, E, 4 * E, block_j, group)
            self.mlp_scratch = (torch.empty(floats, device=model.device),
                                torch.zeros(counters, dtype=torch.int32, device=model.device))

        def run(self, slot):
            assert not self.chooser.do_sample
            buf = self.buf
            logits = mlp_forward(self.model, self.folds, buf, self.tok, self.step_pos, self.mask,
                                 self.cache, self.col, self.pdl, (block_j, group, warps),
                                 self.mlp_scratch)
            greedy_tail(logits, self.finished, self.chooser, self.out, self.tok, self.step_pos,
                        self.col, self.done[slot], buf.scratch[1], tiles=(buf.top, buf.top_i),
                        pdl=self.pdl)

    MLPStep.__name__ = f"mlp_{block_j}_{group}_{warps}"
    return MLPStep


SPLITS = [(16, 16, 8), (16, 16, 4), (8, 16, 4), (8, 32, 8), (32, 8, 8)]


def main(out, dtypes, batch):
    from step_ab import compare_steps
    out.mkdir(parents=True, exist_ok=True)
    steps = {"gemvs": FusedStep} | {s.__name__: s for s in (mlp_step(*t) for t in SPLITS)}
    compare_steps(steps, dtypes, (batch,), "mlp").to_csv(out / f"step_mlp_b{batch}.csv",
                                                         index=False)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]),
         [getattr(torch, d) for d in (sys.argv[2:3] or ["float32", "bfloat16"])],
         int(sys.argv[3]) if len(sys.argv) > 3 else 1)

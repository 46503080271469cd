"""Issue 14, batch 32: why does `c_attn` take 20 µs a layer in the step and 9.9 alone
(results/h200/fused/step_order/)? Alone it was timed without what the step adds: LayerNorm
folded in (`ln`), the K and V written into the cache (`qkv`), programmatic dependent launch
(`pdl`), and the kernel ahead writing the x it reads (`after`: the GEMV ahead of it in the
step, `AHEAD`). Each layer GEMV at batch 32, 20 calls in one CUDA graph on
20 copies of the weight (`step_ab.bench_graph`, L2 flushed), with each of these switched on in
turn, float32 and bfloat16, the library's tiles. `after` times the pair (the GEMV ahead, then
this one) 20 times and subtracts the one ahead alone: this GEMV's share after a kernel that
writes its x, as `tools/probe_step_order.py` measures it in the step.
Usage: python tools/probe_b32_epilogue.py OUT_DIR"""
import pathlib
import sys

import pandas as pd
import torch

from fastgen_lib import fused

B, CALLS, H, L = 32, 20, 12, 116
SHAPES = {"c_attn": (768, 2304), "attn.c_proj": (768, 768), "c_fc": (768, 3072),
          "mlp.c_proj": (3072, 768)}
FEATURES = {"c_attn": ("ln", "qkv"), "c_fc": ("ln", "gelu"), "attn.c_proj": ("residual",),
            "mlp.c_proj": ("residual",)}
AHEAD = {"c_attn": "mlp.c_proj", "c_fc": "attn.c_proj", "mlp.c_proj": "c_fc"}  # in the step
# (attn.c_proj follows the attention, not a GEMV)


def variants(name):
    """(label, features) for `name`: none, each alone, all (the step's); each without and with
    PDL; then the step's features after mlp.c_proj, with PDL."""
    f = FEATURES[name]
    sets = [(), *[(x,) for x in f]] + ([f] if len(f) > 1 else [])
    out = [("+".join(s) or "plain", s) for s in sets]
    out += [(f"{label}+pdl", s + ("pdl",)) for label, s in out]
    if name in AHEAD:
        out.append(("+".join(f) + "+pdl+after", f + ("pdl", "after")))
    return out


def layer_call(name, features, dtype, device="cuda", calls=CALLS):
    """fn(i): the GEMV `name` on weight copy i with `features` (see the module's doc); with
    "after", the GEMV ahead of it in the step first (`AHEAD`), writing the x it reads."""
    K, N = SHAPES[name]
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)
    x = rand(B, K)
    ws = [rand(K, N, scale=K ** -0.5) for _ in range(calls)]
    b = rand(N, scale=0.1)
    E = N // 3
    out = torch.empty(B, E if "qkv" in features else N, device=device, dtype=dtype)
    ln = torch.nn.LayerNorm(K, device=device, dtype=dtype)
    folds = [fused.fold_layernorm(ln, w, b) for w in ws] if "ln" in features else None
    keys, values = (torch.zeros(B, H, L, E // H, device=device, dtype=dtype) for _ in range(2))
    col = torch.tensor(L // 2, device=device)
    residual = rand(B, N) if "residual" in features else None
    need = max(fused.scratch_size(B, k, n, torch.device(device), dtype=dtype)
               for k, n in SHAPES.values())
    scratch = (torch.empty(need, device=device),
               torch.zeros(fused.LOCKS, dtype=torch.int32, device=device))
    kw = dict(gelu="gelu" in features, residual=residual, out=out, scratch=scratch,
              qkv=(keys, values, col) if "qkv" in features else None, pdl="pdl" in features)
    if "after" in features:  # the GEMV ahead in the step writes x, with its own features
        ahead = AHEAD[name]
        Ka, Na = SHAPES[ahead]
        assert Na == K, (ahead, name)
        xa = rand(B, Ka)
        wa = [rand(Ka, K, scale=Ka ** -0.5) for _ in range(calls)]
        ba = rand(K, scale=0.1)
        if ahead == "c_fc":  # LayerNorm and GELU
            fa = [fused.fold_layernorm(torch.nn.LayerNorm(Ka, device=device, dtype=dtype), w, ba)
                  for w in wa]
            kwa = dict(gelu=True)
        else:  # x += xa @ W + b, the residual stream
            fa, kwa = None, dict(residual=x)

    def fn(i):
        if "after" in features:
            fused.gemv(xa, wa[i], fa[i][2] if fa else ba, ln=fa[i] if fa else None, out=x,
                       scratch=scratch, pdl=kw["pdl"], **kwa)
        return fused.gemv(x, ws[i], folds[i][2] if folds else b,
                          ln=folds[i] if folds else None, **kw)
    fn.x, fn.ws, fn.b, fn.ln, fn.keys, fn.values, fn.col = x, ws, b, ln, keys, values, col
    return fn


def main(out):
    from step_ab import bench_graph
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        tag = str(dtype)[6:]
        alone = {}  # each GEMV with the step's features and PDL: what `after` subtracts
        for after in (False, True):  # every GEMV alone first
            for name in SHAPES:
                for label, features in variants(name):
                    if ("after" in features) != after:
                        continue
                    us = bench_graph(layer_call(name, features, dtype))
                    if features == FEATURES[name] + ("pdl",):
                        alone[name] = us
                    if after:
                        us -= alone[AHEAD[name]]
                    rows.append({"dtype": tag, "name": name, "variant": label, "us": us})
                    print(rows[-1], flush=True)
        pd.DataFrame(rows).to_csv(out / "b32_epilogue.csv", index=False)
    d = pd.DataFrame(rows)
    print(d.pivot_table(index=["name", "variant"], columns="dtype", values="us",
                        sort=False).round(2).to_string())


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))

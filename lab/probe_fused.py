"""Where the fused step's GPU time goes, kernel by kernel (issue 14). One profiled 100-token call of
`fused` per (batch, dtype); every step launches the same kernels in the same order, so the k-th
kernel of each step is the same operation: the median duration of each over the last 64 steps,
named by its place in the step (five per layer, four at batch 1, where `attention_proj` joins
the attention and attn.c_proj; the first with the embedding in front; lm_head; the token choice), beside the weight bytes it reads and their bandwidth. Run it in its own process.
Usage: PYTHONPATH=. python lab/probe_fused.py OUT_CSV"""
import sys

import pandas as pd
import torch

import fastgen_lib as fg
from fastgen_lib import measure, traces

N, STEPS, rows = 100, 64, []
LAYER = ["qkv", "attention", "attn.c_proj", "c_fc", "mlp.c_proj"]
LAYER_B1 = ["qkv", "attention_proj", "c_fc", "mlp.c_proj"]  # fused.attention_proj at batch 1
for dtype in (torch.float32, torch.bfloat16):
    model = fg.load_model("124m", device="cuda", dtype=dtype)
    E, V, size = model.config.n_embd, model.config.vocab_size, model.dtype.itemsize
    weights = {"qkv": 3 * E * E, "attn.c_proj": E * E, "attention_proj": E * E, "c_fc": 4 * E * E, "mlp.c_proj": 4 * E * E,
               "lm_head": E * V}
    for batch in (1, 32):
        ids, mask = fg.make_batch(batch, 16, seed=batch, device="cuda")
        call = measure.decoder_call(model, ids, mask, "fused", N)
        call(), call()
        iv = traces.profile_decode(call)
        k = iv[iv.cat == "kernel"].reset_index(drop=True)
        layer = LAYER_B1 if batch == 1 else LAYER
        per = len(layer) * model.config.n_layer + 2
        last = k.tail(per * STEPS)
        kinds = last.name.to_numpy().reshape(STEPS, per)
        assert (kinds == kinds[0]).all(), f"steps differ: not {len(layer)} kernels a layer + 2"
        us = (last.end_us - last.start_us).to_numpy().reshape(STEPS, per)
        names = [n for _ in range(model.config.n_layer) for n in layer]
        names += ["lm_head", "greedy_tail"]
        df = pd.DataFrame({"op": names, "us": pd.DataFrame(us).median().to_numpy()})
        g = df.groupby("op", sort=False).us.agg(["median", "sum", "count"]).reset_index()
        for _, r in g.iterrows():
            nbytes = weights.get(r.op, 0) * size
            rows.append({"dtype": str(dtype)[6:], "batch": batch, "op": r.op, "count": r["count"],
                         "us_each": r["median"], "us_per_step": r["sum"],
                         "tb_s": nbytes / r["median"] / 1e6 if nbytes else None})
        print(pd.DataFrame(rows[-len(g):]).to_string(index=False), flush=True)
    del model
    torch.cuda.empty_cache()
pd.DataFrame(rows).to_csv(sys.argv[1], index=False)

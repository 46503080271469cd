"""Kernels per decode step of `interleaved` (GPT-2 124M, float32, batch 1, 100 new tokens), from
profiles of one call at a time (README.md). The two parts ran as two scripts, in this order:

    PYTHONPATH=$PWD OUT=. python3 results/h200/kernel_count/probe.py calls     # kcount2.txt
    PYTHONPATH=$PWD OUT=. python3 results/h200/kernel_count/probe.py replays   # kcount3.txt"""
import os
import sys

import torch

import fastgen_lib as fg
from fastgen_lib import traces, measure


def profiled(call, n):
    """The profile of call(n), kernel names shortened; its graph replays (>= 8 intervals a
    launch) and the rest."""
    iv = traces.profile_decode(lambda: call(n))
    iv["name"] = iv.name.str.replace("void ", "").str.slice(0, 60)
    size = iv.groupby("correlation").name.transform("size")
    return iv, iv[size >= 8], iv[size < 8]


def calls(call):  # a 1-, 2- and 100-token call: kernels in replays and outside
    for n in (1, 2, 100):
        iv, rep, other = profiled(call, n)
        print(f"n={n}: replays {rep.correlation.nunique()}, kernels in replays "
              f"{int((rep.cat == 'kernel').sum())}, kernels outside "
              f"{int((other.cat == 'kernel').sum())}, all kernels {int((iv.cat == 'kernel').sum())}")
        print(other[other.cat == "kernel"].groupby("name").size().to_string())


def replays(call):  # two 100-token calls: the replays' sizes, what the larger has more, their order
    for k in range(2):
        _, rep, _ = profiled(call, 100)
        sizes = rep.groupby("correlation").size()
        print(f"profile {k}: replay sizes {sizes.value_counts().to_dict()}")
        small = sizes[sizes == sizes.min()].index[0]
        big = sizes[sizes == sizes.max()].index[0]
        d = (rep[rep.correlation == big].name.value_counts()
             .sub(rep[rep.correlation == small].name.value_counts(), fill_value=0))
        print(d[d != 0].to_string())
        order = [int(sizes[c]) for c in rep.groupby("correlation").start_us.min().sort_values().index]
        print("order of sizes:", order[:12], "...", order[-5:])


if __name__ == "__main__":
    part = sys.argv[1]
    sys.stdout = open(os.path.join(os.environ["OUT"], {"calls": "kcount2.txt",
                                                       "replays": "kcount3.txt"}[part]), "w")
    model = fg.load_model("124m", device="cuda", dtype=torch.float32)
    ids, mask = fg.make_batch(1, 16, seed=1, device="cuda")
    call = measure.decoder_call(model, ids, mask, "interleaved", 100)
    call(), call(1)
    {"calls": calls, "replays": replays}[part](call)

import os, sys
import torch
import fastgen_lib as fg
from fastgen_lib import traces, measure
out = os.environ["OUT"]
sys.stdout = open(os.path.join(out, "kcount2.txt"), "w")
model = fg.load_model("124m", device="cuda", dtype=torch.float32)
ids, mask = fg.make_batch(1, 16, seed=1, device="cuda")
call = measure.decoder_call(model, ids, mask, "interleaved", 100)
call(); call(1)
for n in (1, 2, 100):
    iv = traces.profile_decode(lambda: call(n))
    iv["name"] = iv.name.str.replace("void ", "").str.slice(0, 60)
    size = iv.groupby("correlation").name.transform("size")
    rep = iv[size >= 8]
    other = iv[size < 8]
    print(f"n={n}: replays {rep.correlation.nunique()}, kernels in replays {int((rep.cat=='kernel').sum())}, "
          f"kernels outside {int((other.cat=='kernel').sum())}, all kernels {int((iv.cat=='kernel').sum())}")
    print(other[other.cat == "kernel"].groupby("name").size().to_string())

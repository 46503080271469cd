import os, sys
import torch
import fastgen_lib as fg
from fastgen_lib import traces, measure
out = os.environ["OUT"]
sys.stdout = open(os.path.join(out, "kcount3.txt"), "w")
model = fg.load_model("124m", device="cuda", dtype=torch.float32)
ids, mask = fg.make_batch(1, 16, seed=1, device="cuda")
call = measure.decoder_call(model, ids, mask, "interleaved", 100)
call(); call(1)
for k in range(2):
    iv = traces.profile_decode(lambda: call(100))
    iv["name"] = iv.name.str.replace("void ", "").str.slice(0, 60)
    size = iv.groupby("correlation").name.transform("size")
    rep = iv[size >= 8]
    per = rep.groupby("correlation").size()
    print(f"profile {k}: replay sizes {per.value_counts().to_dict()}")
    sizes = rep.groupby("correlation").size()
    small = sizes[sizes == sizes.min()].index[0]; big = sizes[sizes == sizes.max()].index[0]
    a = rep[rep.correlation == small].name.value_counts(); b = rep[rep.correlation == big].name.value_counts()
    d = b.sub(a, fill_value=0); print(d[d != 0].to_string())
    first = rep.groupby("correlation").start_us.min().sort_values()
    print("order of sizes:", [int(sizes[c]) for c in first.index][:12], "...", [int(sizes[c]) for c in first.index][-5:])

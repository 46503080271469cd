"""Same-process A/B of the compiled step's attention (FASTGEN_DECODE_ATTENTION): for `interleaved`, the
time of a whole call, of the prefill alone and of the steps alone, and the profiled step span, with
one_query and sdpa alternating (one_query, sdpa, sdpa, one_query) in one process. On the GPU host:

    PYTHONPATH=. python tools/ab_attention.py 32 1                      # float32, 100 new tokens
    PYTHONPATH=. DTYPE=bfloat16 NEW=400 python tools/ab_attention.py 8 1

One JSON line per measurement (results/h200/ab_attention/same_process_*.jsonl)."""
import json
import os
import sys
import time

import torch

from fastgen_lib import measure
from fastgen_lib.decoders import generate, runner_for, GenConfig
from fastgen_lib.models import EOS, load_model, make_batch

DTYPE, N = os.environ.get("DTYPE", "float32"), int(os.environ.get("NEW", "100"))
model = load_model(os.environ.get("FASTGEN_SIZE", "124m"), dtype=getattr(torch, DTYPE))
INFERENCE = torch.inference_mode()
INFERENCE.__enter__()  # as generate() runs: the runner's buffers are inference tensors
for batch in map(int, sys.argv[1:] or ["32", "1"]):
    ids, mask = make_batch(batch, 16, seed=batch, device=model.device)
    for rnd in range(2):
        for mode in ("one_query", "sdpa") if rnd == 0 else ("sdpa", "one_query"):
            os.environ["FASTGEN_DECODE_ATTENTION"] = mode
            call = lambda: generate(model, ids, mask, decoder="interleaved", max_new_tokens=N,  # noqa
                                    eos_token_id=EOS, pad_token_id=EOS)
            times, _ = measure.time_call(call, repeats=7, warmup=2)
            r = runner_for(model, ids, GenConfig(N, EOS, EOS))
            pre, _ = measure.time_call(lambda: r.prefill(ids, mask), repeats=7, warmup=1)

            def steps():  # prefill (the cache must start over) + 99 graph replays
                r.prefill(ids, mask)
                for i in range(N - 1):
                    r.step(i % 2)
            st, _ = measure.time_call(steps, repeats=7, warmup=1)
            iv = measure.profile_decode(call)
            b = measure.between_steps(iv)
            print(json.dumps({"dtype": DTYPE, "new_tokens": N, "batch": batch, "mode": mode, "call_ms": 1e3 * sorted(times)[3],
                              "prefill_ms": 1e3 * sorted(pre)[3], "steps_ms": 1e3 * (sorted(st)[3] - sorted(pre)[3]),
                              "step_us_median": b.get("step_us_median"), "kernels_per_step": b.get("kernels_per_step")}),
                  flush=True)

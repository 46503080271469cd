"""Same-process A/B of the compiled step's attention (`generate(decode_attention=...)`): for `interleaved`, the
time of a whole call, of the prefill alone and of the steps alone (medians of 7), and the profiled step
span, with one_query and sdpa alternating (one_query, sdpa, sdpa, one_query) in one process. GPU host:

    PYTHONPATH=. python tools/ab_attention.py 32 1                      # float32, 100 new tokens
    PYTHONPATH=. DTYPE=bfloat16 NEW=400 python tools/ab_attention.py 8 1

One JSON line per measurement (results/h200/ab_attention/same_process_*.jsonl)."""
import json
import os
import statistics
import sys

import torch

from fastgen_lib import measure, traces
from fastgen_lib.decoders import generate
from fastgen_lib.steps import GenConfig, GraphStep
from fastgen_lib.models import EOS, load_model, make_batch


def ms(times):
    return 1e3 * statistics.median(times)


@torch.inference_mode()  # as generate() runs: the GraphStep's buffers are inference tensors
def main(batches, dtype, n):
    model = load_model(os.environ.get("FASTGEN_SIZE", "124m"), dtype=getattr(torch, dtype))
    for batch in batches:
        ids, mask = make_batch(batch, 16, seed=batch, device=model.device)
        for mode in ("one_query", "sdpa", "sdpa", "one_query"):
            def call():  # a GraphStep per choice: each keeps its own graphs
                return generate(model, ids, mask, decoder="interleaved", max_new_tokens=n, eos_token_id=EOS,
                                pad_token_id=EOS, decode_attention=mode)
            calls, _ = measure.time_call(call, repeats=7, warmup=2)
            gen = GenConfig(n, EOS, EOS, decode_attention=mode)
            step = GraphStep.start(model, ids, mask, gen, slots=(0, 1))  # the one `call` uses
            pre, _ = measure.time_call(lambda: step.prefill(ids, mask, gen), repeats=7, warmup=1)

            def steps():  # a prefill (the cache must start over), then n-1 graph replays
                step.prefill(ids, mask, gen)
                for i in range(n - 1):
                    step(i % 2)
            both, _ = measure.time_call(steps, repeats=7, warmup=1)
            b = traces.between_steps(traces.profile_decode(call))
            print(json.dumps({"dtype": dtype, "new_tokens": n, "batch": batch, "mode": mode,
                              "call_ms": ms(calls), "prefill_ms": ms(pre), "steps_ms": ms(both) - ms(pre),
                              "step_us_median": b.get("step_us_median"),
                              "kernels_per_step": b.get("kernels_per_step")}), flush=True)


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [32, 1], os.environ.get("DTYPE", "float32"),
         int(os.environ.get("NEW", "100")))

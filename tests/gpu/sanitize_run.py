"""A short `interleaved` run for compute-sanitizer (memcheck, racecheck), started by `bash scripts/gpu.sh tests sanitizer`.

The tiny GPT-2 on CUDA, 3 rows of mixed length, 10 new tokens, an EOS bias so rows stop at different steps;
greedy, then sampled with top-k. Each setting: `compiled` (the same graphs, one stream) as the reference,
then `interleaved` twice (the second call replays captured graphs). Exit 1 if any token differs. Kept small:
under the sanitizer every kernel runs instrumented, and gpu.sh runs this once without it first, so the
compiled kernels come from inductor's cache.
"""
import sys

import torch

import fastgen_lib as fg
from fastgen_lib.models import EOS


def main():
    model = fg.set_eos_bias(fg.load_model("tiny", device="cuda"), 0.7)
    ids, mask = fg.make_batch(3, 8, mixed=True, seed=3, device="cuda")
    bad = 0
    for kw in (dict(), dict(do_sample=True, seed=5, top_k=20)):
        ref = fg.generate(model, ids, mask, decoder="compiled", max_new_tokens=10, eos_token_id=EOS, **kw)
        for _ in range(2):
            out = fg.generate(model, ids, mask, decoder="interleaved", max_new_tokens=10, eos_token_id=EOS, **kw)
            bad += out.shape != ref.shape or not torch.equal(out, ref)
    torch.cuda.synchronize()
    print(f"sanitize_run: {'OK' if bad == 0 else f'{bad} MISMATCHES'}; output {tuple(ref.shape)}", flush=True)
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())

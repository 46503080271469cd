#!/usr/bin/env bash
# First GPU pass: does everything run on CUDA? Headline ladder, profiles, allocator probes.
# Run on the GPU host from the repo root; results go to $OUT (or ./gpu_out).
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT/r"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
log() { echo "== $*"; }
{
log env; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
ls ~/.cache/huggingface/hub 2>/dev/null | head
python3 -m fastgen_lib check
log bench; timeout 300 python3 -m fastgen_lib bench --batch 1 32 --new-tokens 100 --repeats 5 --out "$OUT/r" 2>&1 | grep -v it/s
for d in compiled deferred interleaved static_cache kv_cache; do
  log profile $d; timeout 90 python3 -m fastgen_lib profile --decoder $d --batch 1 --new-tokens 50
done
log memory; timeout 120 python3 - <<'PY'
from fastgen_lib import memory
for conf in ["", "expandable_segments:True"]:
    print(memory.fresh_process(conf, ["--decoder", "kv_cache", "--batch", "8", "--new-tokens", "200", "--size", "124m"]))
PY
} 2>&1 | tee "$OUT/log.txt"

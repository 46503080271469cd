#!/usr/bin/env bash
# Second GPU pass: the sweep (results/h200/sweep*.csv and figures) and where the time goes.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT/h200"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
for b in 1 32; do
  echo "== profile interleaved, batch $b"
  timeout 120 python3 -m fastgen_lib profile --decoder interleaved --batch $b --new-tokens 100 --kernels
done
echo "== sweep"
timeout 470 python3 -m fastgen_lib bench --sweep --dtype float32 bfloat16 --repeats 3 --out "$OUT/h200" 2>&1 | grep -v "it/s\]"
} 2>&1 | tee "$OUT/h200/sweep_log.txt"

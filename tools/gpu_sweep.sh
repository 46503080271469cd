#!/usr/bin/env bash
# The sweep on the GPU host, in pieces that fit one 10-minute device call (the whole grid does not: a
# first try ran past the limit and returned nothing). Rows are written after every cell
# (sweep_partial_<dtype>.csv), so a piece cut short keeps what it measured. Pieces, one call each:
#   BATCHES="1 4 8" bash tools/gpu_sweep.sh ;  BATCHES="16 32" bash tools/gpu_sweep.sh
#   DTYPES="bfloat16" NEW_TOKENS=100 bash tools/gpu_sweep.sh
# then concatenate the CSVs into results/h200/sweep.csv (pandas.concat) and plot with fastgen_lib.plots.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT/h200"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout -k 20 "${BUDGET:-480}" python3 -m fastgen_lib bench --sweep --dtype ${DTYPES:-float32} \
  --batch ${BATCHES:-1 4 8 16 32} --new-tokens ${NEW_TOKENS:-50 100 200 400} --repeats 3 --out "$OUT/h200" \
  2>&1 | grep --line-buffered -v "it/s\]"
} 2>&1 | tee "$OUT/h200/sweep_log.txt"

#!/usr/bin/env bash
# The GPU batch for one device call: jobs in two lanes, one lane per GPU (on a one-GPU host the lanes run one
# after the other), all inside a deadline, each job's results copied to $OUT as soon as it ends, so a job cut
# short by the deadline still leaves what it finished. From the repo root on the GPU host:
#
#   OUT=/somewhere DEADLINE=540 LANE0="notebooks" LANE1="suite sanitizer" bash tools/gpu_lanes.sh
#
# Jobs (each runs in a lane with CUDA_VISIBLE_DEVICES set to that lane's GPU):
#   notebooks    execute $NOTEBOOKS (default: all chapters) in place   -> $OUT/notebooks.tgz
#   suite        pytest -m gpu tests/gpu, $STRESS stress cases (1000)   -> $OUT/gpu/ (junit, json, report.md)
#   sanitizer    compute-sanitizer memcheck + racecheck (tests/gpu)     -> $OUT/gpu/sanitizer_*.log
#   sweep_fp32   bench --sweep, float32, $BATCHES x $NEW_TOKENS        -> $OUT/h200_float32/
#   sweep_bf16   the same in bfloat16                                   -> $OUT/h200_bfloat16/
#   ab_sdpa      compiled/interleaved at batch 1 and 32, PyTorch's attention choice vs FASTGEN_DECODE_SDPA=math,
#                each in a fresh process, twice, alternating           -> $OUT/ab_sdpa/
# A job gets whatever time is left before the deadline minus a margin for packing; it is interrupted with
# SIGINT (pytest and the sweep stop cleanly and keep their partial files).
set -u
OUT=${OUT:-gpu_out}; DEADLINE=${DEADLINE:-540}; mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
left() { echo $(( DEADLINE - 25 - ($(date +%s) - T0) )); }
BATCHES=${BATCHES:-1 4 8 16 32}; NEW_TOKENS=${NEW_TOKENS:-50 100 200 400}

run_job() {  # run_job JOB LOG
  local b; b=$(left)
  if [ "$b" -lt 30 ]; then echo "== $1: skipped, $b s left"; return; fi
  echo "== $1 on GPU $CUDA_VISIBLE_DEVICES, budget $b s, $(date -u +%T)"
  case $1 in
    notebooks)
      timeout -s INT -k 20 "$b" python3 tools/run_notebooks.py ${NOTEBOOKS:-} --inplace --allow-errors \
        --timeout 400 --out "$OUT/failed_nb" 2>&1 | grep --line-buffered -v "it/s"
      tar czf "$OUT/notebooks.tgz" notebooks ;;
    suite)
      mkdir -p "$OUT/gpu"
      PYTEST_BUDGET=$b FASTGEN_STRESS_CASES=${STRESS:-1000} FASTGEN_REPORT_DIR=$OUT/gpu bash tests/gpu/run.sh pytest ;;
    sanitizer)
      mkdir -p "$OUT/gpu"
      SANITIZER_BUDGET=$b FASTGEN_REPORT_DIR=$OUT/gpu bash tests/gpu/run.sh sanitizer ;;
    sweep_fp32|sweep_bf16)
      local dt=float32; [ "$1" = sweep_bf16 ] && dt=bfloat16
      nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
      local ns=$NEW_TOKENS; [ "$1" = sweep_bf16 ] && ns=${BF16_TOKENS:-$NEW_TOKENS}
      timeout -s INT -k 20 "$b" python3 -m fastgen_lib bench --sweep --dtype $dt --batch $BATCHES \
        --new-tokens $ns --repeats 3 --out "$OUT/h200_$dt" 2>&1 | grep --line-buffered -v "it/s\]" ;;
    ab_sdpa)
      mkdir -p "$OUT/ab_sdpa"
      for i in 1 2; do for mode in auto math; do
        b=$(left); [ "$b" -lt 60 ] && break 2
        FASTGEN_DECODE_SDPA=$mode timeout -s INT -k 10 "$b" python3 -m fastgen_lib bench --batch 1 32 \
          --new-tokens 100 --methods compiled interleaved --repeats 5 --out "$OUT/ab_sdpa/${mode}_$i" 2>&1 \
          | grep --line-buffered -v "it/s\]"
      done; done ;;
    *) echo "unknown job $1" ;;
  esac
  echo "== $1 done, $(date -u +%T), $(( $(date +%s) - T0 )) s since start"
}

lane() {  # lane GPU JOBS...
  export CUDA_VISIBLE_DEVICES=$1; shift
  for job in "$@"; do run_job "$job"; done
}

{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__,
"| GPUs", torch.cuda.device_count())'; } 2>&1 | tee "$OUT/env.txt"
NGPU=$(nvidia-smi -L | wc -l)
if [ "$NGPU" -ge 2 ]; then
  lane 0 ${LANE0:-} > "$OUT/lane0.log" 2>&1 &
  lane 1 ${LANE1:-} > "$OUT/lane1.log" 2>&1 &
  wait
else
  { lane 0 ${LANE0:-}; lane 0 ${LANE1:-}; } > "$OUT/lane0.log" 2>&1
fi
# the device tool brings back only a few files: everything but the notebooks goes in one archive
(cd "$OUT" && tar czf results.tgz --exclude=notebooks.tgz --exclude=results.tgz . )
for f in "$OUT"/lane*.log; do echo "######## $f"; tail -c 4000 "$f"; done
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# The GPU batch for one device call: jobs in lanes, one lane per GPU (lanes beyond the GPU count queue on
# GPU lane mod count), each lane on its own share of the CPU cores, all inside a deadline, each job's results
# copied to $OUT as soon as it ends, so a job cut short by the deadline still leaves what it finished. Then
# the FINAL jobs, on GPU 0 alone (UNTIL=seconds ends the lanes early to leave them time). From the repo root:
#
#   OUT=/somewhere DEADLINE=540 LANE0="notebooks" LANE1="suite sanitizer" bash tools/gpu_lanes.sh
#   LANE0="sweep_fp32:1,4,8" LANE1="sweep_fp32:16,32" FINAL="merge_sweep notebooks:08_results" ...
#
# Jobs (each runs in a lane with CUDA_VISIBLE_DEVICES set to that lane's GPU); JOB:ARG passes an argument:
#   notebooks    execute chapters in place; ARG: names, comma-separated (default all)   -> notebooks_*.tgz
#   suite        pytest -m gpu tests/gpu, $STRESS stress cases (1000)   -> $OUT/gpu/ (junit, json, report.md)
#   sanitizer    compute-sanitizer memcheck + racecheck (tests/gpu)     -> $OUT/gpu/sanitizer_*.log
#   sweep_fp32   bench --sweep, float32; ARG: batches, comma-separated  -> $OUT/h200_float32[_ARG]/
#   sweep_bf16   the same in bfloat16                                   -> $OUT/h200_bfloat16[_ARG]/
#   merge_sweep  join every sweep.csv under $OUT into results/h200/ (CSV, claims, figures) -> $OUT/h200_merged/
#   ab_same_process  tools/ab_attention.py: one_query vs sdpa inside one process, float32 (batch 32, 1; 100
#                tokens) and bfloat16 (batch 8, 1; 400 tokens)     -> $OUT/ab_attention/same_process_*.jsonl
#   profile      the interleaved decode's kernels and gaps at batch 1 and 32 -> $OUT/profile_log.txt
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
left() { echo $(( ${UNTIL:-$DEADLINE} - 25 - ($(date +%s) - T0) )); }  # UNTIL: the lanes' own deadline
BATCHES=${BATCHES:-1 4 8 16 32}; NEW_TOKENS=${NEW_TOKENS:-50 100 200 400}

run_job() {  # run_job JOB[:ARG]
  local b job=${1%%:*} arg=""; [[ $1 == *:* ]] && arg=${1#*:}
  b=$(left)
  if [ "$b" -lt 30 ]; then echo "== $1: skipped, $b s left"; return; fi
  echo "== $1 on GPU $CUDA_VISIBLE_DEVICES, budget $b s, $(date -u +%T)"
  case $job in
    notebooks)
      local nbs=() n; for n in ${arg//,/ }; do nbs+=("notebooks/${n%.ipynb}.ipynb"); done
      timeout -s INT -k 20 "$b" python3 tools/run_notebooks.py "${nbs[@]}" --inplace --allow-errors \
        --timeout 400 --out "$OUT/failed_nb" 2>&1 | grep --line-buffered -v "it/s"
      tar czf "$OUT/notebooks_${arg//,/_}.tgz" ${nbs[@]:-notebooks} ;;
    suite)
      mkdir -p "$OUT/gpu"
      PYTEST_BUDGET=$b FASTGEN_STRESS_CASES=${STRESS:-1000} FASTGEN_REPORT_DIR=$OUT/gpu bash tests/gpu/run.sh pytest ;;
    sanitizer)
      mkdir -p "$OUT/gpu"
      SANITIZER_BUDGET=$b FASTGEN_REPORT_DIR=$OUT/gpu bash tests/gpu/run.sh sanitizer ;;
    sweep_fp32|sweep_bf16)
      local dt=float32; [ "$job" = sweep_bf16 ] && dt=bfloat16
      nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
      local bs=${arg//,/ }
      timeout -s INT -k 20 "$b" python3 -m fastgen_lib bench --sweep --dtype $dt --batch ${bs:-$BATCHES} \
        --new-tokens $NEW_TOKENS --repeats 3 --out "$OUT/h200_$dt${arg:+_${arg//,/-}}" 2>&1 \
        | grep --line-buffered -v "it/s\]" ;;
    merge_sweep)
      local csvs=() d  # each sweep's CSV; of one cut short by the deadline, the rows it checkpointed
      for d in "$OUT"/h200_float32* "$OUT"/h200_bfloat16*; do
        [ -f "$d/sweep.csv" ] && csvs+=("$d/sweep.csv") || csvs+=($(ls "$d"/sweep_partial_*.csv 2>/dev/null))
      done
      python3 -m fastgen_lib bench --merge "${csvs[@]}" --out results/h200 2>&1 | tail -40
      mkdir -p "$OUT/h200_merged" && cp results/h200/sweep* "$OUT/h200_merged/" ;;
    ab_same_process)
      mkdir -p "$OUT/ab_attention"
      timeout -k 10 "$b" python3 tools/ab_attention.py 32 1 | tee "$OUT/ab_attention/same_process_float32.jsonl"
      DTYPE=bfloat16 NEW=400 timeout -k 10 "$(left)" python3 tools/ab_attention.py 8 1 \
        | tee "$OUT/ab_attention/same_process_bfloat16.jsonl" ;;
    profile)
      for bs in 1 32; do
        echo "== profile interleaved, batch $bs" >> "$OUT/profile_log.txt"
        timeout -k 10 "$(left)" python3 -m fastgen_lib profile --decoder interleaved --batch $bs --new-tokens 100 \
          --kernels >> "$OUT/profile_log.txt" 2>&1
      done; tail -30 "$OUT/profile_log.txt" ;;
    *) echo "unknown job $1" ;;
  esac
  echo "== $1 done, $(date -u +%T), $(( $(date +%s) - T0 )) s since start"
}

lane() {  # lane GPU CPUS JOBS...
  export CUDA_VISIBLE_DEVICES=$1; local cpus=$2; shift 2
  command -v taskset > /dev/null && taskset -cp "$cpus" $BASHPID > /dev/null  # its jobs inherit these cores
  for job in "$@"; do run_job "$job"; done
}

{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__,
"| GPUs", torch.cuda.device_count())'; } 2>&1 | tee "$OUT/env.txt"
NGPU=$(nvidia-smi -L | wc -l); [ "$NGPU" -ge 1 ] || NGPU=1
NCPU=$(nproc); PER=$(( NCPU / (NGPU < 4 ? NGPU : 4) )); [ "$PER" -ge 1 ] || PER=1
for g in $(seq 0 $(( NGPU < 4 ? NGPU - 1 : 3 ))); do
  jobs=""; for l in 0 1 2 3; do [ $(( l % NGPU )) -eq "$g" ] && { v=LANE$l; jobs="$jobs ${!v:-}"; }; done
  lane "$g" "$(( g * PER ))-$(( g * PER + PER - 1 ))" $jobs > "$OUT/lane$g.log" 2>&1 &
done
wait
[ -n "${FINAL:-}" ] && UNTIL=$DEADLINE lane 0 "0-$(( NCPU - 1 ))" $FINAL > "$OUT/final.log" 2>&1
# the device tool brings back only a few files: everything goes in one archive, beside the logs
(cd "$OUT" && tar czf /tmp/results.tgz . && find . -mindepth 1 -maxdepth 1 ! -name '*.log' -exec rm -rf {} + && mv /tmp/results.tgz .)
for f in "$OUT"/lane*.log "$OUT"/final.log; do [ -f "$f" ] && { echo "######## $f"; tail -c 3000 "$f"; }; done
echo "total $(( $(date +%s) - T0 )) s"

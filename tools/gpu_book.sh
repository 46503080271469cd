#!/usr/bin/env bash
# The book's canonical run: chapters executed in place, one after another, on one otherwise idle GPU
# (nothing else runs on the host while they time). From the repo root on a GPU host:
#
#   OUT=/somewhere bash tools/gpu_book.sh 00_setup 01_naive      # these chapters, in this order
#   OUT=/somewhere TESTS="short or fused" DEADLINE=560 bash tools/gpu_book.sh ...  # then pytest -m gpu \
#                                  tests/gpu -k "$TESTS" (an expression), if DEADLINE (s) leaves time
#
# Writes $OUT/book.tgz (the executed notebooks and every file the chapters wrote under results/),
# $OUT/book_log.txt, the host's pace while each chapter ran ($OUT/pace_log.csv, $OUT/chapters.csv,
# summarised at the end of the log: "HOST SLOW" names chapters not to commit; PACE_MAX, MON_CPU;
# after a slow chapter the run stops, unless STOP_SLOW=0)
# and, with TESTS, $OUT/gpu_tests.txt. The GPU's state before the run is logged,
# to show that it was idle. GATE_MS=0.62 (say) first samples the host's pace and exits 3 without
# running a chapter if its median is over that (tools/pace_monitor.py gate): the call can then
# run something that the host's pace does not touch instead.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -d .whl ]; then  # once per machine: a later call on the same machine finds them
  [ -d /tmp/site/nbclient ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
stamp=$(mktemp); touch "$stamp"
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total --format=csv
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
} 2>&1 | tee "$OUT/book_log.txt"
pack() {  # after every chapter, so that a call cut short still brings back what finished
  files=$( (for ch in "$@"; do echo "notebooks/$ch.ipynb"; done; find results -newer "$stamp" -type f) )
  # shellcheck disable=SC2086
  tar czf "$OUT/book.tgz.tmp" $files && mv "$OUT/book.tgz.tmp" "$OUT/book.tgz"
}
# the chapters' process on four fixed cores: a host-bound loop (chapters 1-4) that migrates between
# cores times bimodally (5 or 8 ms a step in one run of chapter 1); pinned, its IQR is a few percent
PIN=${PIN:-8-11}
if [ -n "${GATE_MS:-}" ]; then
  taskset -c "$PIN" python3 tools/pace_monitor.py gate --max-ms "$GATE_MS" 2>&1 \
    | tee -a "$OUT/book_log.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 3
fi
# the host's pace on a core of its own while the chapters run (tools/pace_monitor.py): a chapter
# whose median pace is over PACE_MAX ms ran on a slow host, and its timings are not to be committed
MON_CPU=${MON_CPU:-15}; taskset -c "$MON_CPU" true 2>/dev/null || MON_CPU=$(nproc --all | awk '{print $1-1}')
taskset -c "$MON_CPU" python3 tools/pace_monitor.py run "$OUT/pace_log.csv" &
MON=$!
echo "chapter,start_s,end_s" > "$OUT/chapters.csv"
T0=$(date +%s)
done_chapters=()
for ch in "$@"; do
  t_ch=$(date +%s.%N)
  taskset -c "$PIN" python3 tools/run_notebooks.py --inplace --allow-errors --timeout 900 "notebooks/$ch.ipynb" 2>&1 \
    | tee -a "$OUT/book_log.txt"
  echo "$ch,$t_ch,$(date +%s.%N)" >> "$OUT/chapters.csv"
  done_chapters+=("$ch")
  pack "${done_chapters[@]}"
  # a host slow in one chapter is slow again within seconds (results/h200/pace/noisy_host): stop
  if [ "${STOP_SLOW:-1}" = 1 ] && ! python3 tools/pace_monitor.py summary "$OUT/pace_log.csv" \
      "$OUT/chapters.csv" --max-ms "${PACE_MAX:-0.65}" > /dev/null 2>&1; then
    echo "HOST SLOW during $ch: the chapters after it are not run (STOP_SLOW=0 runs them)" \
      | tee -a "$OUT/book_log.txt"
    break
  fi
done
echo "chapters took $(( $(date +%s) - T0 )) s" | tee -a "$OUT/book_log.txt"
kill "$MON"; wait "$MON" 2>/dev/null
python3 tools/pace_monitor.py summary "$OUT/pace_log.csv" "$OUT/chapters.csv" \
  --max-ms "${PACE_MAX:-0.65}" 2>&1 | tee -a "$OUT/book_log.txt"
# GPU tests after the chapters (never beside them), if TESTS is set and DEADLINE (s) leaves time
if [ -n "${TESTS:-}" ] && [ $(( ${DEADLINE:-100000} - ($(date +%s) - T0) )) -gt 60 ]; then
  # shellcheck disable=SC2086
  timeout $(( ${DEADLINE:-100000} - ($(date +%s) - T0) - 15 )) \
    python3 -m pytest -m gpu tests/gpu -q -rA -p no:logging -k "$TESTS" 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
fi

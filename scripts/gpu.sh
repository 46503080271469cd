#!/usr/bin/env bash
# The GPU jobs, from the repo root on a CUDA host (the H200 that the device tool lends). Results go
# to --out DIR; the device tool brings back only a few loose files, so each job packs what it wrote.
#
#   bash scripts/gpu.sh book [--out DIR] [--pin CPUS] [--gate MS] [--pace-max MS] [--keep-going]
#                            CHAPTER...
#       the book's canonical run: notebooks/CHAPTER.ipynb executed in place, one after another, on
#       the cores CPUS (8-11: a host-bound loop that migrates between cores times bimodally),
#       beside scripts/pace_monitor.py on a core of its own. --gate MS: first sample the host's
#       pace, and exit 3 without running a chapter if its median is over MS (the call can then run
#       something the pace does not touch). After a chapter whose median pace is over --pace-max
#       (0.65 ms) the run stops (a slow host stays slow: results/h200/pace/noisy_host/), unless
#       --keep-going. DIR (gpu_out) gets book.tgz (the chapters and every file they wrote under
#       results/, packed after each chapter), book_log.txt, pace_log.csv and chapters.csv.
#   bash scripts/gpu.sh tests [--out DIR] [--budget S] [--stress N] [-k EXPR] [pytest] [sanitizer]
#       pytest -m gpu tests/gpu (-k EXPR; --stress N: the stress test's cases, 1000), or
#       compute-sanitizer's memcheck and racecheck on tests/gpu/sanitize_run.py, or both (default:
#       pytest), each stopped at S seconds (540); then DIR/report.md (tests/gpu/report.py; a stage
#       not run is reported from an earlier run's files in DIR). DIR: results/gpu. Exit 1 if a
#       stage failed.
#   bash scripts/gpu.sh smoke [--out DIR]
#       does everything run on CUDA: `fastgen_lib check`, the headline bench at batch 1 and 32,
#       the profiles of five decoders, the allocator probe; DIR/log.txt and DIR/r/.
#
# --dry: parse, check and print the settings, run nothing (the CPU's test of this script).
set -u
cd "$(dirname "$0")/.." || exit 1
usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit "${1:-0}"; }
die() { echo "gpu.sh: $*" >&2; exit 2; }

JOB=${1:-}; shift || true
case $JOB in
  book|tests|smoke) ;; -h|--help) usage 0;; *) die "no job '$JOB' (book, tests, smoke)";;
esac
OUT="" PIN=8-11 GATE="" PACE_MAX=0.65 KEEP_GOING=0 BUDGET=540 STRESS="" K="" DRY=0 ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=${2:?--out DIR}; shift;;
    --pin) PIN=${2:?--pin CPUS}; shift;;
    --gate) GATE=${2:?--gate MS}; shift;;
    --pace-max) PACE_MAX=${2:?--pace-max MS}; shift;;
    --keep-going) KEEP_GOING=1;;
    --budget) BUDGET=${2:?--budget S}; shift;;
    --stress) STRESS=${2:?--stress N}; shift;;
    -k) K=${2:?-k EXPR}; shift;;
    --dry) DRY=1;;
    -h|--help) usage 0;;
    -*) die "unknown option $1 (--help)";;
    *) ARGS+=("$1");;
  esac
  shift
done
case $JOB in
  book)
    [ ${#ARGS[@]} -gt 0 ] || die "book: name the chapters (e.g. 09_fused)"
    for ch in "${ARGS[@]}"; do
      [ -f "notebooks/$ch.ipynb" ] || die "book: no notebooks/$ch.ipynb"
    done
    OUT=${OUT:-gpu_out};;
  tests)
    [ ${#ARGS[@]} -gt 0 ] || ARGS=(pytest)
    for s in "${ARGS[@]}"; do
      [[ $s == pytest || $s == sanitizer ]] || die "tests: no stage '$s'"
    done
    OUT=${OUT:-results/gpu};;
  smoke)
    [ ${#ARGS[@]} -eq 0 ] || die "smoke takes no names"
    OUT=${OUT:-gpu_out};;
esac
if [ "$DRY" = 1 ]; then
  echo "job=$JOB out=$OUT pin=$PIN gate=$GATE pace_max=$PACE_MAX keep_going=$KEEP_GOING" \
    "budget=$BUDGET stress=$STRESS k=$K args=${ARGS[*]}"
  exit 0
fi

mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -d .whl ]; then  # the book's packages (nbclient, ...), installed once per machine
  [ -d /tmp/site/nbclient ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=$(command -v python3 || command -v python)

book() {
  local log=$OUT/book_log.txt stamp mon ch t_ch t0 done_chapters=()
  stamp=$(mktemp)
  { date -u '+%Y-%m-%d %H:%M:%S UTC'  # the GPU's state before the run: that it was idle
    nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total --format=csv
    nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv; } 2>&1 | tee "$log"
  if [ -n "$GATE" ]; then
    taskset -c "$PIN" "$PY" scripts/pace_monitor.py gate --max-ms "$GATE" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || exit 3
  fi
  local cpu=15; taskset -c $cpu true 2>/dev/null || cpu=$(( $(nproc --all) - 1 ))
  taskset -c $cpu "$PY" scripts/pace_monitor.py run "$OUT/pace_log.csv" &
  mon=$!
  echo "chapter,start_s,end_s" > "$OUT/chapters.csv"
  t0=$(date +%s)
  for ch in "${ARGS[@]}"; do
    t_ch=$(date +%s.%N)
    taskset -c "$PIN" "$PY" scripts/run_notebooks.py --inplace --allow-errors --timeout 900 \
      "notebooks/$ch.ipynb" 2>&1 | tee -a "$log"
    echo "$ch,$t_ch,$(date +%s.%N)" >> "$OUT/chapters.csv"
    done_chapters+=("notebooks/$ch.ipynb")
    # shellcheck disable=SC2046  # after every chapter: a call cut short brings back what finished
    tar czf "$OUT/book.tgz.tmp" "${done_chapters[@]}" $(find results -newer "$stamp" -type f) \
      && mv "$OUT/book.tgz.tmp" "$OUT/book.tgz"
    if [ "$KEEP_GOING" = 0 ] && ! "$PY" scripts/pace_monitor.py summary "$OUT/pace_log.csv" \
        "$OUT/chapters.csv" --max-ms "$PACE_MAX" > /dev/null 2>&1; then
      echo "HOST SLOW during $ch: the chapters after it are not run (--keep-going runs them)" \
        | tee -a "$log"
      break
    fi
  done
  echo "chapters took $(( $(date +%s) - t0 )) s" | tee -a "$log"
  kill "$mon"; wait "$mon" 2>/dev/null
  "$PY" scripts/pace_monitor.py summary "$OUT/pace_log.csv" "$OUT/chapters.csv" \
    --max-ms "$PACE_MAX" 2>&1 | tee -a "$log"
}

tests() {
  local pytest_rc=skipped memcheck_rc=skipped racecheck_rc=skipped san tool rc sb
  export FASTGEN_REPORT_DIR=$OUT  # where tests/gpu writes its JSON
  [ -n "$STRESS" ] && export FASTGEN_STRESS_CASES=$STRESS
  { echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   host: $(hostname)" \
      "  git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
      || echo "nvidia-smi: not available"
    "$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| transformers", transformers.__version__)
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")' 2>&1
  } | tee "$OUT/env.txt"
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  if [[ " ${ARGS[*]} " == *" pytest "* ]]; then
    rm -f "$OUT"/{junit.xml,stress.json,repeat.json,bf16.json,sync.json}  # no stale numbers
    # SIGINT at the budget: pytest stops cleanly and still writes its junit XML (no pipe to tee)
    timeout -s INT -k 30 "$BUDGET" "$PY" -m pytest -m gpu tests/gpu -v -rA ${K:+-k "$K"} \
      --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
    pytest_rc=$?
    tail -40 "$OUT/pytest.log"
  fi
  if [[ " ${ARGS[*]} " == *" sanitizer "* ]]; then
    rm -f "$OUT"/sanitizer_*.log
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ ! -x "$san" ]; then
      memcheck_rc=notfound racecheck_rc=notfound
      echo "compute-sanitizer: not found on PATH nor in /usr/local/cuda/bin"
    else
      # in-process compiles (no worker pool for the sanitizer to follow), and one plain run first
      # so that the sanitized runs find their kernels in inductor's cache
      export TORCHINDUCTOR_COMPILE_THREADS=1
      sb=$(( (BUDGET - 90) / 2 ))  # after a warm-up of at most 90 s: memcheck, then racecheck
      timeout 90 "$PY" tests/gpu/sanitize_run.py 2>&1 | tee "$OUT/sanitize_warmup.log"
      for tool in memcheck racecheck; do
        # API return codes are torch's to check (it probes some on purpose): kernel errors only.
        # --launch-timeout 0: the default 10 s is shorter than python's start with torch
        timeout -k 10 "$sb" "$san" --tool "$tool" --launch-timeout 0 --report-api-errors no \
          --target-processes application-only "$PY" tests/gpu/sanitize_run.py \
          > "$OUT/sanitizer_$tool.log" 2>&1
        rc=$?
        grep -E "ERROR SUMMARY|sanitize_run" "$OUT/sanitizer_$tool.log" \
          || echo "(no summary; exit $rc)"
        printf -v "${tool}_rc" '%s' "$rc"
      done
    fi
  fi
  "$PY" tests/gpu/report.py "$OUT" pytest="$pytest_rc" memcheck="$memcheck_rc" \
    racecheck="$racecheck_rc"
  echo "exit codes: pytest=$pytest_rc memcheck=$memcheck_rc racecheck=$racecheck_rc;" \
    "report: $OUT/report.md"
  for rc in "$pytest_rc" "$memcheck_rc" "$racecheck_rc"; do
    [[ $rc == skipped || $rc == 0 ]] || exit 1
  done
}

smoke() {
  mkdir -p "$OUT/r"
  { echo "== env"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    "$PY" -m fastgen_lib check
    echo "== bench"
    timeout 300 "$PY" -m fastgen_lib bench --batch 1 32 --new-tokens 100 --repeats 5 \
      --out "$OUT/r" 2>&1 | grep -v it/s
    for d in compiled deferred interleaved static_cache kv_cache; do
      echo "== profile $d"
      timeout 90 "$PY" -m fastgen_lib profile --decoder $d --batch 1 --new-tokens 50
    done
    echo "== memory"  # kv_cache at batch 8, default allocator against expandable segments
    timeout 120 "$PY" -c 'from fastgen_lib import memory
for conf in ["", "expandable_segments:True"]:
    print(memory.fresh_process(conf, ["--decoder", "kv_cache", "--batch", "8",
                                      "--new-tokens", "200", "--size", "124m"]))'
  } 2>&1 | tee "$OUT/log.txt"
}

$JOB

#!/usr/bin/env bash
# GPU reliability run (issue 5), from the repo root on a CUDA host:
#     bash tests/gpu/run.sh                  # everything
#     bash tests/gpu/run.sh pytest           # only the pytest suite  (~6-8 min on an H200, mostly compiles)
#     bash tests/gpu/run.sh sanitizer        # only compute-sanitizer (warm-up + 2 tools, up to 240 s each)
# PYTEST_BUDGET and SANITIZER_BUDGET (seconds) bound the stages; a stage cut short still leaves its report.
# Results and report.md go to $FASTGEN_REPORT_DIR (default results/gpu); a stage not run this time is
# reported from an earlier run's files there, if any. Every stage runs even if an earlier one failed; the
# exit codes are collected and the report is always written. Exit 1 if anything failed.
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${FASTGEN_REPORT_DIR:-results/gpu}
export FASTGEN_REPORT_DIR=$OUT
mkdir -p "$OUT"
STAGES=" ${*:-pytest sanitizer} "
PY=${PYTHON:-$(command -v python3 || command -v python)}
pytest_rc=skipped memcheck_rc=skipped racecheck_rc=skipped

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')   host: $(hostname)   git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
  "$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| transformers", transformers.__version__)
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")' 2>&1
} | tee "$OUT/env.txt"
nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"

if [[ $STAGES == *" pytest "* ]]; then
  echo "== pytest -m gpu tests/gpu"
  rm -f "$OUT"/{junit.xml,stress.json,repeat.json,bf16.json,sync.json}  # no stale numbers in the report
  # SIGINT at the budget: pytest stops cleanly and still writes its junit XML (so no pipe to tee here)
  timeout -s INT -k 30 "${PYTEST_BUDGET:-3600}" "$PY" -m pytest -m gpu tests/gpu -v -rA \
    --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
  pytest_rc=$?
  tail -40 "$OUT/pytest.log"
fi

if [[ $STAGES == *" sanitizer "* ]]; then
  rm -f "$OUT"/sanitizer_*.log
  SAN=$(command -v compute-sanitizer || true)
  [[ -z $SAN && -x /usr/local/cuda/bin/compute-sanitizer ]] && SAN=/usr/local/cuda/bin/compute-sanitizer
  if [[ -z $SAN ]]; then
    memcheck_rc=notfound racecheck_rc=notfound
    echo "compute-sanitizer: not found on PATH nor in /usr/local/cuda/bin"
  else
    # in-process compiles (no worker pool for the sanitizer to follow), and one plain run first so the
    # sanitized runs find their kernels in inductor's cache
    export TORCHINDUCTOR_COMPILE_THREADS=1
    SB=$(( (${SANITIZER_BUDGET:-720} - 90) / 2 ))  # after a warm-up of at most 90 s: memcheck, racecheck
    echo "== warm-up: python tests/gpu/sanitize_run.py"
    timeout 90 "$PY" tests/gpu/sanitize_run.py 2>&1 | tee "$OUT/sanitize_warmup.log"
    for tool in memcheck racecheck; do
      echo "== $SAN --tool $tool"
      # API return codes are torch's to check (it probes and handles some on purpose): count kernel errors only
      # --launch-timeout 0: the default (10 s) is shorter than python's start with torch, and the sanitizer
      # then gives up with "No attachable process found" (seen on the H200, 2026-11-29)
      timeout -k 10 "$SB" "$SAN" --tool "$tool" --launch-timeout 0 --report-api-errors no \
        --target-processes application-only \
        "$PY" tests/gpu/sanitize_run.py > "$OUT/sanitizer_$tool.log" 2>&1
      rc=$?
      grep -E "ERROR SUMMARY|sanitize_run" "$OUT/sanitizer_$tool.log" || echo "(no summary; exit $rc)"
      printf -v "${tool}_rc" '%s' "$rc"
    done
  fi
fi

"$PY" tests/gpu/report.py "$OUT" pytest="$pytest_rc" memcheck="$memcheck_rc" racecheck="$racecheck_rc"
echo "exit codes: pytest=$pytest_rc memcheck=$memcheck_rc racecheck=$racecheck_rc; report: $OUT/report.md"
for rc in "$pytest_rc" "$memcheck_rc" "$racecheck_rc"; do
  [[ $rc == skipped || $rc == 0 ]] || exit 1
done
exit 0

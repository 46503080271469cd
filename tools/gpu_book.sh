#!/usr/bin/env bash
# The book's canonical run: chapters executed in place, one after another, on one otherwise idle GPU
# (nothing else runs on the host while they time). From the repo root on a GPU host:
#
#   OUT=/somewhere bash tools/gpu_book.sh 00_setup 01_naive      # these chapters, in this order
#   OUT=/somewhere TESTS="-k short" bash tools/gpu_book.sh ...   # first: pytest -m gpu tests/gpu $TESTS
#
# Writes $OUT/book.tgz (the executed notebooks and every file the chapters wrote under results/),
# $OUT/book_log.txt and, with TESTS, $OUT/gpu_tests.txt. The GPU's state before the run is logged,
# to show that it was idle.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
stamp=$(mktemp); touch "$stamp"
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used,memory.total --format=csv
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
} 2>&1 | tee "$OUT/book_log.txt"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  python3 -m pytest -m gpu tests/gpu -q -rA $TESTS 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
fi
for ch in "$@"; do
  python3 tools/run_notebooks.py --inplace --timeout 900 "notebooks/$ch.ipynb" 2>&1 \
    | tee -a "$OUT/book_log.txt"
done
files=$( (for ch in "$@"; do echo "notebooks/$ch.ipynb"; done; find results -newer "$stamp" -type f) )
# shellcheck disable=SC2086
tar czf "$OUT/book.tgz" $files && echo "packed: $(echo $files | wc -w) files" | tee -a "$OUT/book_log.txt"

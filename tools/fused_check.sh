#!/usr/bin/env bash
# The fused decoder on a GPU host, from the repo root (OUT: where results go):
#   OUT=... bash tools/fused_check.sh check   # kernel and token tests, then the bench and kernel counts
#   OUT=... bash tools/fused_check.sh tune    # the GEMV's tiles (tools/tune_fused.py)
#   OUT=... bash tools/fused_check.sh book    # chapter 9's tables: the bench, PDL on and off,
#       kernels per step, each kernel's time, each GEMV alone (default tiles), what is read
#       before the waits (tools/probe_early_kv.py), attention and c_proj joined at batch 1
#       (tools/probe_attention_proj.py), into R (default results/h200/fused/run),
#       packed as $OUT/run.tgz; PARTS="bench pdl" (say) runs some of them; the bench times
#       `compiled`, `interleaved`, `fused` and `model.generate` (hf_static), or METHODS
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
PIN=${PIN:-8-11}
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv | tee "$OUT/gpu_state.txt"
case "${1:-check}" in
  check)
    timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused.py \
      tests/gpu/test_gpu_fused.py 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
    taskset -c "$PIN" timeout 200 python3 -m fastgen_lib bench --batch 1 32 --dtype float32 \
      bfloat16 --methods interleaved fused --repeats 10 --out "$OUT/bench" 2>&1 \
      | grep -v "it/s" | tee "$OUT/bench_log.txt"
    timeout 120 python3 tools/probe_kernels.py "$OUT/kernels.csv" interleaved fused 2>&1 | tail -12
    ;;
  probe)  # the GPU kernel tests, then each kernel's time in the step, then a short tile sweep
    timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused.py 2>&1 | tail -3
    timeout 150 python3 tools/probe_fused.py "$OUT/probe_fused.csv" 2>&1
    timeout ${TUNE_S:-300} python3 tools/tune_fused.py "$OUT/tune.csv" 2>&1 | tail -60
    ;;
  book)  # into R (in the tree, kept between calls), packed into $OUT/run.tgz after each part: the
    # device tool brings back only a few loose files. PARTS: some of the parts, in this order
    R=${R:-results/h200/fused/run}; mkdir -p "$R"; cp "$OUT/gpu_state.txt" "$R/"
    pack() { tar czf "$OUT/run.tgz" "$R"; }
    for part in ${PARTS:-tests bench pdl kernels fused tune early_kv attention_proj}; do
      case $part in
        tests) timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_fused.py \
          tests/gpu/test_gpu_fused.py 2>&1 | tail -15 > "$R/gpu_tests.txt";;
        bench) taskset -c "$PIN" timeout 540 python3 -m fastgen_lib bench --batch 1 32 --dtype \
          float32 bfloat16 --methods ${METHODS:-compiled interleaved fused hf_static} \
          --repeats 10 --out "$R" 2>&1 | grep -v "it/s" > "$R/bench_log.txt";;
        pdl) taskset -c "$PIN" timeout 150 python3 tools/probe_pdl.py "$R" 2>&1 \
          | grep -v "it/s" > "$R/probe_pdl_log.txt";;
        kernels) timeout 280 python3 tools/probe_kernels.py "$R/kernels.csv" interleaved fused \
          > "$R/probe_kernels_log.txt" 2>&1;;
        fused) timeout 100 python3 tools/probe_fused.py "$R/probe_fused.csv" \
          > "$R/probe_fused_log.txt" 2>&1;;
        tune) timeout 60 python3 tools/tune_fused.py "$R/tune.csv" defaults > "$R/tune_log.txt" 2>&1;;
        early_kv) taskset -c "$PIN" timeout 300 python3 tools/probe_early_kv.py "$R" \
          > "$R/probe_early_kv_log.txt" 2>&1;;
        attention_proj) taskset -c "$PIN" timeout 200 python3 tools/probe_attention_proj.py "$R" \
          > "$R/probe_attention_proj_log.txt" 2>&1;;
      esac
      pack
    done
    tail -n 3 "$R"/*_log.txt
    ;;
  tune)
    timeout 560 python3 tools/tune_fused.py "$OUT/tune.csv" 2>&1 | tail -60
    ;;
esac

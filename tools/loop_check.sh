#!/usr/bin/env bash
# The gpu_loop decoder on a GPU host, from the repo root (OUT: where results go):
#   OUT=... bash tools/loop_check.sh   # its GPU tests (TESTS=0 skips them), then
#       tools/probe_loop.py (main, then cpu; PROBES="main" or "cpu" for one), pinned to the cores
#       PIN (8-11), which the busy host shares; into R (default $OUT/loop), packed into
#       $OUT/loop.tgz after each step (the device tool brings back only a few loose files)
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
PIN=${PIN:-8-11}
R=${R:-$OUT/loop}; mkdir -p "$R"
pack() { tar czf "$OUT/loop.tgz" "$R"; }
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv | tee "$R/gpu_state.txt"
if [ "${TESTS:-1}" != 0 ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_loop.py \
    tests/gpu/test_gpu_decoders.py -k gpu_loop 2>&1 | tail -8 | tee "$R/gpu_tests.txt"
  pack
fi
case " ${PROBES:-main cpu} " in *" main "*)
  taskset -c "$PIN" timeout 330 python3 tools/probe_loop.py "$R" 2>&1 | tee "$R/probe_log.txt"
  pack;;
esac
case " ${PROBES:-main cpu} " in *" cpu "*)
  taskset -c "$PIN" timeout 120 python3 tools/probe_loop.py "$R" cpu 2>&1 \
    | tee "$R/probe_cpu_log.txt"
  pack;;
esac

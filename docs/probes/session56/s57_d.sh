#!/usr/bin/env bash
# session 57, call D (prepared in session 56), from wip/early-weights's checkout; carry .devrun: its bits on the GPU
# (each file under its own limit, each verdict logged by bench/gpu_suite.sh): the rescore sweep, the engine's
# invariance and launch tests (decode graphs under PDL), the linear's early-block, 3-D grid and control tests, the
# RMSNorm tests (held rows with their weights early and not), then the battery's qwen2 cells in bf16
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-ew PYTHONUNBUFFERED=1
timeout 80 python3 -P bench/rescore_sweep.py --commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json > $OUT/sweep.log 2>&1
echo "== sweep rc $?"; grep -E "^\| " $OUT/sweep.log
root=$OUT
OUT=$root/d1 TEST_TIMEOUT=120 BENCHES=";" bash bench/gpu_suite.sh tests/test_engine_invariance.py tests/test_launch_gpu.py
OUT=$root/d2 TEST_TIMEOUT=150 TEST_K="early or decode_tiles or another_chunk" BENCHES=";" \
  bash bench/gpu_suite.sh tests/test_kernels_matmul_gpu.py
OUT=$root/d4 TEST_TIMEOUT=60 TEST_K="rmsnorm" BENCHES=";" bash bench/gpu_suite.sh tests/test_kernels_rows_gpu.py
echo "== at $(( $(date +%s) - T_START )) s"
OUT=$root/d3 TEST_TIMEOUT=$(( 570 - $(date +%s) + T_START )) TEST_K="qwen2" BENCHES=";" \
  bash bench/gpu_suite.sh tests/test_battery.py
echo "== total $(( $(date +%s) - T_START )) s"
grep -hE " (PASSED|FAILED|ERROR)|stopped after" $root/d*/gpu_tests.log | cut -c1-150

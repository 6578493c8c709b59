#!/usr/bin/env bash
# session 62, for the next session's first call; carry .devrun (copy docs/probes/session59/s59_d.sh and this file
# there). On an H200: the one run (s59_d.sh: every case, each arm isolated, then the 1.5B's batch-1 step), which
# alone decides the 0.5B batch-1 goal. On any other card (the tile A/B is done and merged, session 62): the rest of
# the matmul and attention GPU test files, each test's verdict logged, under TOTAL seconds (default 540).
set -u
T_START=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $name"
case "$name" in
  *H200*) TOTAL=${TOTAL:-540} bash .devrun/s59_d.sh ;;
  *) left=$(( ${TOTAL:-540} - 10 ))
     OUT=/tmp/suite TEST_TIMEOUT=$(( left / 2 )) BENCHES=";" \
       bash bench/gpu_suite.sh tests/test_kernels_matmul_gpu.py tests/test_kernels_attention_gpu.py
     grep -E "^(FAILED|ERROR)|stopped after" /tmp/suite/gpu_tests.log; cp /tmp/suite/gpu_tests.log $OUT/ ;;
esac
echo "== at $(( $(date +%s) - T_START )) s"
exit 0

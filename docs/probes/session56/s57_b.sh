#!/usr/bin/env bash
# session 57, call B (prepared in session 56), main with wip/pdl-early-loads merged; carry .devrun: the bits session 56
# did not reach on the branch's tree, through bench/gpu_suite.sh (each test's verdict logged, also past a limit;
# $OUT/b*/gpu_tests.log come back): the battery's qwen3-0.6b cell, the attention file's bf16 one-split tests and the
# 8B query tile in bf16
set -u
T_START=$(date +%s)
root=$OUT
OUT=$root/b1 TEST_TIMEOUT=230 TEST_K="qwen3" BENCHES=";" bash bench/gpu_suite.sh tests/test_battery.py
echo "== battery at $(( $(date +%s) - T_START )) s"
OUT=$root/b2 TEST_TIMEOUT=$(( 560 - $(date +%s) + T_START )) BENCHES=";" \
  TEST_K="(one_split and dtype1) or (query_tile_is_a_schedule and dtype1 and llama)" \
  bash bench/gpu_suite.sh tests/test_kernels_attention_gpu.py
echo "== attention at $(( $(date +%s) - T_START )) s"
grep -hE " (PASSED|FAILED|ERROR)|stopped after" $root/b*/gpu_tests.log | cut -c1-150

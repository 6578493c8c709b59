#!/usr/bin/env bash
# session 56, call D (prepared in session 55): wip/pdl-early-loads's bits on the GPU, from its checkout (each file
# under its own limit, verdicts one a line): the engine's invariance and launch tests first (decode graphs with PDL,
# where an early read could race), the rotary store, the attention plan's replays, then the attention file
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-new PYTHONUNBUFFERED=1
timeout 80 python3 -P bench/rescore_sweep.py --commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json > $OUT/sweep.log 2>&1
echo "== sweep rc $?"; grep -E "^\| " $OUT/sweep.log
cd tests
t() { local lim=$1; shift; timeout $lim python3 -P -m pytest -m gpu -v -p no:cacheprovider "$@" 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | cut -c1-140 | head -60; }
t 120 test_engine_invariance.py test_launch_gpu.py
t 60 test_kernels_rows_gpu.py -k "rotary_store or rmsnorm"
t 60 test_attention_plan_gpu.py
t 220 test_kernels_attention_gpu.py -k "reference or stock or prefetch or one_split"

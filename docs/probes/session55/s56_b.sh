#!/usr/bin/env bash
# session 56, call B (prepared in session 55), main 45c3ab6 or later: the bits owed on main after the held RMSNorm row
# (each under its own limit, verdicts one a line): the rescore sweep, the battery, the rows file's RMSNorm tests in
# their new form, the attention file's last query-tile test
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
timeout 100 python3 -P bench/rescore_sweep.py --commitment bench/tuned/h200_qwen2-0.5b_grpo32x8.json > $OUT/sweep.log 2>&1
echo "== sweep rc $?"; grep -E "^\| " $OUT/sweep.log
cd tests
t() { local lim=$1; shift; timeout $lim python3 -P -m pytest -m gpu -v -p no:cacheprovider "$@" 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | cut -c1-160 | head -40; }
t 40 test_kernels_rows_gpu.py -k rmsnorm
t 300 test_battery.py
t 100 test_kernels_attention_gpu.py -k "query_tile_is_a_schedule and dtype1 and llama"

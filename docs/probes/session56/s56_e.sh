#!/usr/bin/env bash
# session 56, call E: wip/pdl-early-loads's remaining bits (battery, 8B query tile, rotary store's tail, one split)
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-new PYTHONUNBUFFERED=1
cd tests
t() { local lim=$1; shift; timeout $lim python3 -P -m pytest -m gpu -v -p no:cacheprovider "$@" 2>&1 \
  | grep -E "FAILED|ERROR|passed|failed|^E " | cut -c1-160 | head -30; }
t 40 test_kernels_rows_gpu.py -k "rotary_store"
t 300 test_battery.py
t 90 test_kernels_attention_gpu.py -k "one_split and llama"
t 110 test_kernels_attention_gpu.py -k "query_tile_is_a_schedule and dtype1 and llama"

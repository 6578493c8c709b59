#!/usr/bin/env bash
# session 63, call B (either card; carry .devrun): stock's order effect, bench/order_probe.py, under TOTAL seconds.
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
timeout ${TOTAL:-250} python3 -P bench/order_probe.py --commitment bench/tuned/h200_qwen2-0.5b_decode1.json 2>&1 \
  | grep -v "^\s*$" | tail -12
echo "rc ${PIPESTATUS[0]}"

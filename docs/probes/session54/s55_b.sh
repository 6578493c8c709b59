#!/usr/bin/env bash
# session 55, call B: the attention file's last three GPU tests, then the engine invariance file (verdicts one a line)
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
cd tests
timeout 250 python3 -P -m pytest -m gpu -v -p no:cacheprovider test_kernels_attention_gpu.py \
  -k "query_tile or unrolled" 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | cut -c1-120
timeout 300 python3 -P -m pytest -m gpu -v -p no:cacheprovider test_engine_invariance.py 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|passed|failed" | cut -c1-120

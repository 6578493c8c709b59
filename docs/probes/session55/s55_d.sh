#!/usr/bin/env bash
# session 55, call D: wip/rms-one-block's and wip/div-free's bits on the GPU (each file under its own limit, verdicts one a line)
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-new PYTHONUNBUFFERED=1
cd tests
t() { local lim=$1; shift; timeout $lim python3 -P -m pytest -m gpu -v -p no:cacheprovider "$@" 2>&1 \
  | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | cut -c1-120; }
t 200 test_kernels_matmul_gpu.py -k "3d_grid or another_chunk or reference_and_invariance"
t 150 test_kernels_rows_gpu.py -k "rotary or rope or rmsnorm"
t 200 test_engine_invariance.py test_launch_gpu.py

#!/usr/bin/env bash
# The GPU suite: every GPU test, then the GPU benchmarks, on a machine that already has torch and
# triton (the device image has no network, so nothing is installed: the package is laid out with
# symlinks on PYTHONPATH instead of `pip install -e`). Logs go to ${OUT:-/tmp/gpu_suite}.
# Usage, from the repository root: bash bench/gpu_suite.sh [test files...]   (default: all of tests/)
# BENCHES="bench/a.py; bench/b.py --flag" picks the benchmark commands, ';'-separated (default: every
# bench/kernels_*_bench.py); an entry may be `-m module args`. BENCH_TIMEOUT=S stops each one after S s.
set -uo pipefail
root=$(pwd)
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
pkg=$(bash "$root/bench/link_package.sh" "$root")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export DETENT_CACHE_DIR=/tmp/selir-cache  # outside $OUT: only 8 files come back from there
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' | tee "$out/env.txt"
if [ $# -eq 0 ]; then set -- tests; fi
python3 -P -m pytest -m gpu -q -p no:cacheprovider -rs --durations=15 "$@" 2>&1 | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
IFS=';' read -ra benches <<< "${BENCHES:-$(ls bench/kernels_*_bench.py | paste -sd';')}"
for b in "${benches[@]}"; do
    b=$(echo $b)  # trim
    [ -z "$b" ] && continue
    echo "== python3 $b" | tee -a "$out/gpu_bench.md"
    timeout "${BENCH_TIMEOUT:-0}" python3 -P $b 2>&1 | tee -a "$out/gpu_bench.md"
done
exit "$status"

#!/usr/bin/env bash
# The GPU suite: every GPU test, then the GPU benchmarks, on a machine that already has torch and
# triton (the device image has no network, so nothing is installed: the package is laid out with
# symlinks on PYTHONPATH instead of `pip install -e`). Logs go to ${OUT:-/tmp/gpu_suite}.
# Usage, from the repository root: bash bench/gpu_suite.sh [test files...]   (default: all of tests/)
# BENCHES="bench/a.py; bench/b.py --flag" picks the benchmark commands, ';'-separated (default: every
# bench/kernels_*_bench.py); an entry may be `-m module args`. BENCH_TIMEOUT=S stops each one after S s,
# TEST_TIMEOUT=S each test file's pytest; TEST_K="expr" passes `-k expr` to each (a few tests of a long file).
set -uo pipefail
root=$(pwd)
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
pkg=$(bash "$root/bench/link_package.sh" "$root")
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export DETENT_CACHE_DIR=/tmp/selir-cache  # outside $OUT: only 8 files come back from there
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' | tee "$out/env.txt"
if [ $# -eq 0 ]; then set -- tests; fi
# one pytest per test file, each under TEST_TIMEOUT seconds (0: none), each test's verdict on its own line
# in the log: a call stopped at its limit still says which tests passed
status=0
: > "$out/gpu_tests.log"
select=()
if [ -n "${TEST_K:-}" ]; then select=(-k "$TEST_K"); fi
for f in "$@"; do
    timeout "${TEST_TIMEOUT:-0}" python3 -P -m pytest -m gpu -v -p no:cacheprovider -rs --durations=5 \
        ${select[@]+"${select[@]}"} "$f" > "$out/one_file.log" 2>&1
    rc=$?
    cat "$out/one_file.log" >> "$out/gpu_tests.log"
    [ $rc -eq 5 ] && rc=0  # no GPU test in that file
    if [ $rc -eq 124 ]; then
        echo "$f: stopped after ${TEST_TIMEOUT}s; $(grep -c " PASSED" "$out/one_file.log") passed before" \
            | tee -a "$out/gpu_tests.log"
    fi
    [ $rc -ne 0 ] && status=$rc
    grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed|skipped|deselected|error).* in [0-9.]+s" "$out/one_file.log" | sed "s|^|$f: |"
done
rm -f "$out/one_file.log"
IFS=';' read -ra benches <<< "${BENCHES:-$(ls bench/kernels_*_bench.py | paste -sd';')}"
for b in "${benches[@]}"; do
    b=$(echo $b)  # trim
    [ -z "$b" ] && continue
    echo "== python3 $b" | tee -a "$out/gpu_bench.md"
    timeout "${BENCH_TIMEOUT:-0}" python3 -P $b 2>&1 | tee -a "$out/gpu_bench.md"
done
exit "$status"

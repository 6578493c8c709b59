#!/usr/bin/env bash
# session 60; carry .devrun. wip/tile32-default (.devrun/wip_t32.patch on this tree, in a copy): the GPU bits tests
# (every site's rows across M and tile choices, the engine's invariance in fp32 and bf16 with stock failing, the bf16
# battery on qwen2-0.5b), then its default arm's batch-1 step beside stock's. TOTAL seconds (default 540).
set -u
T_START=$(date +%s)
rm -rf /tmp/wip && mkdir -p /tmp/wip && cp -r . /tmp/wip/ && cd /tmp/wip && patch -p1 -s < .devrun/wip_t32.patch || exit 1
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-wip PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
python3 -P -c 'import detent_rl.kernels.programs.matmul as m; print(m.__file__, m.NARROW_CHOICE)'
(cd tests && timeout $(( ${TOTAL:-540} > 340 ? 330 : ${TOTAL:-540} - 10 )) python3 -P -m pytest -m gpu -q -x -p no:cacheprovider -rA test_kernels_matmul_gpu.py \
  test_engine_invariance.py test_battery.py -k "rows_follow or decode_tiles or another_chunk or needle or bs1_vs_bsn \
  or (gpu_battery and qwen2-0.5b)" 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -40)
echo "== tests at $(( $(date +%s) - T_START )) s"
[ -n "${TESTS_ONLY:-}" ] && exit 0
left=$(( ${TOTAL:-540} - $(date +%s) + T_START ))
[ $left -gt 60 ] && timeout $left python3 -P -m detent_rl.bench --arms stock,detent --max-num-tokens 8192 \
  --stock-pdl on --rounds 2 --cases decode-1 --out /tmp/wipb > /tmp/wipb.log 2>&1
echo "== wip bench rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode|^device' /tmp/wipb/bench.md
cp /tmp/wipb/bench.md $OUT/wip_decode1.md 2>/dev/null; tail -3 /tmp/wipb.log
exit 0

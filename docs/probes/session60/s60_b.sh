#!/usr/bin/env bash
# session 60; carry .devrun. The default tuple's M <= 16 tile against wip/tile32-default's rule: every batch-1 tune
# (D1 on the H200 and the H100, D15's qkv, o) chose tile_32 = 1 (16 x 32) where the default is 0 (16 x 64), except the
# 1.5B gate_up (280 tiles of 16 x 64) and down. The rule: 16 x 32 where the 16 x 64 tiles times the chunks number
# under two a multiprocessor, at M <= 16 only (17-32 keep the swapped warpgroup tile). A schedule knob, bit-neutral:
# `tuned` here is the default tuple with tile_32 = 1 on the sites the rule takes (.devrun/t32_tuple.py ... rule), which
# at M = 1 is exactly what the rule runs; `detent` the default itself; each arm's run in its own process (the bench's
# default on a GPU). Then, in the time left, the branch's GPU bits tests (.devrun/s60_c.sh's first part).
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
python3 -P .devrun/t32_tuple.py qwen2-0.5b rule /tmp/t32_05.json cuda && \
python3 -P .devrun/t32_tuple.py qwen2-1.5b rule /tmp/t32_15.json cuda || exit 1
timeout 200 python3 -P -m detent_rl.bench --arms stock,detent,tuned --max-num-tokens 8192 --stock-pdl on --rounds 2 \
  --cases decode-1 --commitment decode-1=/tmp/t32_05.json \
  --out /tmp/ab05 > /tmp/ab05.log 2>&1
echo "== 0.5B rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode|^device' /tmp/ab05/bench.md
cp /tmp/ab05/bench.md $OUT/ab05.md; cp /tmp/ab05/bench.json $OUT/ab05.json; tail -3 /tmp/ab05.log
left=$(( ${TOTAL:-540} - $(date +%s) + T_START ))
[ $left -gt 60 ] && timeout $(( left > 150 ? 150 : left )) python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,detent,tuned \
  --max-num-tokens 8192 --stock-pdl on --rounds 2 --cases decode-1 \
  --commitment decode-1=/tmp/t32_15.json --out /tmp/ab15 > /tmp/ab15.log 2>&1
echo "== 1.5B rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode' /tmp/ab15/bench.md; cp /tmp/ab15/bench.md $OUT/ab15.md
tail -3 /tmp/ab15.log
left=$(( ${TOTAL:-540} - $(date +%s) + T_START ))
[ $left -gt 90 ] && TESTS_ONLY=1 TOTAL=$left bash .devrun/s60_c.sh
exit 0

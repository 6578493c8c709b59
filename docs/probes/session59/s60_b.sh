#!/usr/bin/env bash
# prepared in session 59 (no device time left to run it); carry .devrun. The default tuple's M <= 32 tile against the
# tuner's batch-1 pick: every batch-1 tune (D1 on the H200 and the H100, D15's qkv and o) chose tile_32 = 1 (16 x 32)
# where the default is 0 (16 x 64). A schedule knob, bit-neutral: `tuned` here is the default tuple with tile_32 = 1
# on every linear site (.devrun/t32_tuple.py), `detent` the default itself; each arm's run in its own process (the
# bench's default on a GPU). If tile_32 = 1 wins at batch 1 and holds at batch 32 on both models, it becomes the knob's
# default (kernels/programs/matmul.py), with the gemm case at M = 1-32 and the bits tests on the GPU.
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
python3 -P .devrun/t32_tuple.py qwen2-0.5b 1 /tmp/t32_05.json cuda && \
python3 -P .devrun/t32_tuple.py qwen2-1.5b 1 /tmp/t32_15.json cuda || exit 1
timeout 240 python3 -P -m detent_rl.bench --arms stock,detent,tuned --max-num-tokens 8192 --stock-pdl on --rounds 2 \
  --cases decode-1,decode-32,gemm --commitment decode-1=/tmp/t32_05.json,decode-32=/tmp/t32_05.json,gemm=/tmp/t32_05.json \
  --out /tmp/ab05 > /tmp/ab05.log 2>&1
echo "== 0.5B rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode' /tmp/ab05/bench.md; cp /tmp/ab05/bench.md $OUT/ab05.md
left=$(( ${TOTAL:-540} - $(date +%s) + T_START ))
[ $left -gt 60 ] && timeout $left python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,detent,tuned \
  --max-num-tokens 8192 --stock-pdl on --rounds 2 --cases decode-1,decode-32 \
  --commitment decode-1=/tmp/t32_15.json,decode-32=/tmp/t32_15.json --out /tmp/ab15 > /tmp/ab15.log 2>&1
echo "== 1.5B rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode' /tmp/ab15/bench.md; cp /tmp/ab15/bench.md $OUT/ab15.md

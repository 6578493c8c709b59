#!/usr/bin/env bash
# session 58, call B (prepared in session 57), main; carry .devrun.
# 1 which side of the round-1 ratio moves: decode-1 in 3 rounds (bench.md now prints each arm's figure a round), the
#   same with every run in a process of its own (--isolate), and the profile of stock run first, then after detent,
#   in one process (which kernels slow down, if stock does);
# 2 the fusion headroom of the tuned batch-1 step, each small-kernel family left out of the replayed decode graph in
#   turn (time only: the outputs are garbage), the 0.5B with D1 and the 1.5B with D15, PDL on
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; D15=bench/tuned/h200_qwen2-1.5b_decode1.json
timeout 60 python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 \
  --stock-pdl on --rounds 3 --cases decode-1 --out $OUT/rounds > /tmp/rounds.log 2>&1
echo "== rounds rc $?"; grep -E '^\| decode-1' $OUT/rounds/bench.md
timeout 150 python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 \
  --stock-pdl on --rounds 3 --cases decode-1 --isolate --out /tmp/isolated > /tmp/isolated.log 2>&1
echo "== isolated rc $?"; grep -E '^\| decode-1' /tmp/isolated/bench.md; cp /tmp/isolated/bench.md $OUT/isolated.md
timeout 90 python3 -P bench/decode_profile.py --batch 1 --arms stock,detent,stock --top 14 > $OUT/order.log 2>&1
echo "== order rc $?"; grep -E "^## |^\| nvjet|^\| _|^\| void cublas" $OUT/order.log | cut -c1-150
timeout 130 python3 -P bench/launch_ablation_probe.py --commitment $D1 --rounds 3 > $OUT/ablation_05.log 2>&1
echo "== 0.5B rc $? at $(( $(date +%s) - T_START )) s"; tail -9 $OUT/ablation_05.log
timeout $(( 570 - $(date +%s) + T_START )) python3 -P bench/launch_ablation_probe.py --model qwen2-1.5b \
  --commitment $D15 --rounds 3 > $OUT/ablation_15.log 2>&1
echo "== 1.5B rc $? at $(( $(date +%s) - T_START )) s"; tail -9 $OUT/ablation_15.log

#!/usr/bin/env bash
# session 58, call B (prepared in session 57), main; carry .devrun: the fusion headroom of the tuned batch-1 step,
# each small-kernel family left out of the replayed decode graph in turn (time only: the outputs are garbage), the
# 0.5B with D1 and the 1.5B with D15, PDL on
set -u
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
timeout 200 python3 -P bench/launch_ablation_probe.py --commitment bench/tuned/h200_qwen2-0.5b_decode1.json \
  --rounds 3 > $OUT/ablation_05.log 2>&1; echo "== 0.5B rc $?"; tail -9 $OUT/ablation_05.log
timeout 200 python3 -P bench/launch_ablation_probe.py --model qwen2-1.5b \
  --commitment bench/tuned/h200_qwen2-1.5b_decode1.json --rounds 3 > $OUT/ablation_15.log 2>&1
echo "== 1.5B rc $?"; tail -9 $OUT/ablation_15.log

#!/usr/bin/env bash
# session 59, call B: the 1.5B's batch-1 step by site (decode_profile --by-slot, PDL off so that kernel times do not
# overlap), stock and tuned, then the 0.5B's; carry .devrun.
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; D15=bench/tuned/h200_qwen2-1.5b_decode1.json
timeout 200 python3 -P bench/decode_profile.py --model qwen2-1.5b --batch 1 --arms stock --commitment $D15 \
  --pdl off --by-slot --top 30 > $OUT/slots_15.log 2>&1; echo "== 1.5B rc $? at $(( $(date +%s) - T_START )) s"
grep -E "^## |matmul|nvjet|cublas|rmsnorm" $OUT/slots_15.log | cut -c1-150
timeout 150 python3 -P bench/decode_profile.py --batch 1 --arms stock --commitment $D1 \
  --pdl off --by-slot --top 30 > $OUT/slots_05.log 2>&1; echo "== 0.5B rc $? at $(( $(date +%s) - T_START )) s"
grep -E "^## |matmul|nvjet|cublas|rmsnorm" $OUT/slots_05.log | cut -c1-150

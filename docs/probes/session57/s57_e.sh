#!/usr/bin/env bash
# session 57, call E, main (d2258ef); carry .devrun. On an H200: s57_a.sh (the one run, the D1 re-tune and its A/B,
# the 1.5B decode-1). On an H100: the same one run, then the tuned batch-1 step's profile against stock's.
set -u
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name())')
case "$name" in *H200*) exec bash .devrun/s57_a.sh ;; esac
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
mkdir -p $OUT/all
timeout 330 python3 -P -m detent_rl.bench --arms stock,detent,tuned,det --max-num-tokens 8192,long=16384 \
  --stock-pdl on --rounds 1 --serves 5 --cases decode-1,decode-32,poisson,grpo,long,gemm \
  --commitment decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T --out $OUT/all > /tmp/run.log 2>&1
echo "one run rc $? at $(( $(date +%s) - T_START )) s"; tail -3 /tmp/run.log
grep -v "^\s*$" $OUT/all/bench.md | head -40
left=$(( 580 - $(date +%s) + T_START ))
timeout $left python3 -P bench/decode_profile.py --batch 1 --arms stock --commitment $D1 --top 24 \
  > $OUT/profile.log 2>&1; echo "== profile rc $? at $(( $(date +%s) - T_START )) s"; head -c 7000 $OUT/profile.log

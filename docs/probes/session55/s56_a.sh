#!/usr/bin/env bash
# session 56, call A (prepared in session 55), main 45c3ab6 or later; carry .devrun. The goals' card (H200) wanted.
# 1 the one run; 2 the batch-1 re-tune and its A/B against D1; 3 the 1.5B decode-1.
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json
mkdir -p $OUT/all
t0=$(date +%s)
timeout 330 python3 -P -m detent_rl.bench --arms stock,detent,tuned,det --max-num-tokens 8192,long=16384 \
  --stock-pdl on --rounds 1 --serves 5 --cases decode-1,decode-32,poisson,grpo,long,gemm \
  --commitment decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T --out $OUT/all > /tmp/run.log 2>&1
echo "one run rc $? in $(( $(date +%s) - t0 )) s"; tail -3 /tmp/run.log
grep -v "^\s*$" $OUT/all/bench.md | head -60
timeout 90 python3 -P -m detent_rl.tune --model qwen2-0.5b --device cuda --prompts 1 --samples 1 --max-num-seqs 1 \
  --prompt-len 128 --new-tokens 128 --micro-batch 1 --max-context 784 --max-batch 256 --max-num-tokens 8192 \
  --families matmul,attention,rmsnorm,log_softmax --no-check --out $OUT/D1.json > /tmp/tune.log 2>&1
echo "== re-tune rc $? at $(( $(date +%s) - T_START )) s"; tail -4 /tmp/tune.log
for c in $D1 $OUT/D1.json; do
  [ -f $c ] && [ $(( $(date +%s) - T_START )) -lt 470 ] && timeout 50 python3 -P -m detent_rl.bench --arms stock,tuned \
    --commitment decode-1=$c --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --out /tmp/ab \
    > /tmp/ab.log 2>&1; echo "== decode-1 with $c rc $?"; grep -E '^\| decode-1' /tmp/ab/bench.md 2>/dev/null
done
left=$(( 575 - $(date +%s) + T_START ))
[ $left -gt 60 ] && timeout $left python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,tuned \
  --commitment decode-1=$D15 --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --out /tmp/d15 \
  > /tmp/d15.log 2>&1; echo "== 1.5B decode-1 rc $?"; grep -E '^\| decode-1' /tmp/d15/bench.md 2>/dev/null
echo "total $(( $(date +%s) - T_START )) s"

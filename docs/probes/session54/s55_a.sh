#!/usr/bin/env bash
# session 55, call A (prepared in session 54), main with fixed_split merged (37f7988 or later); carry .devrun.
# 1 the one run (the goals' card, H200 hoped); 2 the 1.5B decode-1; 3 the rescore sweep; 4 the attention file's last
# three GPU tests (each verdict logged even if the limit stops it).
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
left=$(( 440 - $(date +%s) + T_START ))
[ $left -gt 40 ] && timeout $left python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,tuned \
  --commitment decode-1=$D15 --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --out /tmp/d15 \
  > /tmp/d15.log 2>&1; echo "== 1.5B decode-1 rc $?"; grep -E '^\| decode-1' /tmp/d15/bench.md 2>/dev/null
left=$(( 560 - $(date +%s) + T_START ))
[ $left -gt 60 ] && { timeout $left python3 -P bench/rescore_sweep.py --commitment $T > /tmp/sweep.log 2>&1;
  echo "== rescore sweep rc $?"; tail -15 /tmp/sweep.log; cp /tmp/sweep.log $OUT/; }
echo "total $(( $(date +%s) - T_START )) s"

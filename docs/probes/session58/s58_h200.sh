#!/usr/bin/env bash
# session 58 on an H200 (main 6cde613); carry .devrun. 1 the one run (session 52's command); 2 the order check:
# decode-1 in 3 rounds in one process, then --isolate'd; 3 the 1.5B decode-1, --isolate'd, in the time left.
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json
mkdir -p $OUT/all
timeout 330 python3 -P -m detent_rl.bench --arms stock,detent,tuned,det --max-num-tokens 8192,long=16384 \
  --stock-pdl on --rounds 1 --serves 5 --cases decode-1,decode-32,poisson,grpo,long,gemm \
  --commitment decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T --out $OUT/all > /tmp/run.log 2>&1
echo "one run rc $? at $(( $(date +%s) - T_START )) s"; tail -3 /tmp/run.log
grep -v "^\s*$" $OUT/all/bench.md | head -24
timeout 60 python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 \
  --stock-pdl on --rounds 3 --cases decode-1 --out /tmp/rounds > /tmp/rounds.log 2>&1
echo "== rounds rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/rounds/bench.md
cp /tmp/rounds/bench.md $OUT/rounds.md
left=$(( ${TOTAL:-575} - 5 - $(date +%s) + T_START ))
timeout $(( left < 150 ? left : 150 )) python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 \
  --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --isolate --out /tmp/isolated > /tmp/isolated.log 2>&1
echo "== isolated rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/isolated/bench.md
cp /tmp/isolated/bench.md $OUT/isolated.md; tail -3 /tmp/isolated.log
left=$(( ${TOTAL:-575} - $(date +%s) + T_START ))
[ $left -gt 60 ] && timeout $left python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,tuned \
  --commitment decode-1=$D15 --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --isolate \
  --out /tmp/d15 > /tmp/d15.log 2>&1; echo "== 1.5B decode-1 rc $? at $(( $(date +%s) - T_START )) s"
grep -E '^\| decode-1' /tmp/d15/bench.md 2>/dev/null; cp /tmp/d15/bench.md $OUT/d15.md 2>/dev/null; tail -2 /tmp/d15.log

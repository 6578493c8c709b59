#!/usr/bin/env bash
# session 58's last try, ~300 s of commands; carry .devrun. H200: the one run, then decode-1 --isolate'd in the time
# left. H100: the order check (decode-1 in 3 rounds, the same --isolate'd, stock profiled first and after detent).
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name())')
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
END=${TOTAL:-300}
case "$name" in *H200*)
  mkdir -p $OUT/all
  if [ $END -ge 250 ]; then cases=decode-1,decode-32,poisson,grpo,long,gemm; arms=stock,detent,tuned,det
    tokens=8192,long=16384; tuples=decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T
  else cases=decode-1,decode-32; arms=stock,detent,tuned; tokens=8192; tuples=decode-1=$D1,decode-32=$T; fi
  timeout $(( END - 5 )) python3 -P -m detent_rl.bench --arms $arms --max-num-tokens $tokens \
    --stock-pdl on --rounds 1 --serves 5 --cases $cases --commitment $tuples --out $OUT/all > /tmp/run.log 2>&1
  echo "one run rc $? at $(( $(date +%s) - T_START )) s"; tail -3 /tmp/run.log
  grep -v "^\s*$" $OUT/all/bench.md | head -30
  left=$(( END - $(date +%s) + T_START ))
  [ $left -gt 70 ] && timeout $left python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 \
    --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --isolate --out /tmp/iso > /tmp/iso.log 2>&1
  echo "== isolated rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/iso/bench.md 2>/dev/null
  cp /tmp/iso/bench.md $OUT/isolated.md 2>/dev/null; exit 0 ;;
esac
timeout 60 python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 \
  --stock-pdl on --rounds 3 --cases decode-1 --out /tmp/rounds > /tmp/rounds.log 2>&1
echo "== rounds rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/rounds/bench.md
cp /tmp/rounds/bench.md $OUT/rounds.md
timeout 150 python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 \
  --stock-pdl on --rounds 3 --cases decode-1 --isolate --out /tmp/isolated > /tmp/isolated.log 2>&1
echo "== isolated rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/isolated/bench.md
cp /tmp/isolated/bench.md $OUT/isolated.md; tail -3 /tmp/isolated.log
left=$(( END - $(date +%s) + T_START ))
[ $left -gt 40 ] && timeout $left python3 -P bench/decode_profile.py --batch 1 --arms stock,detent,stock --top 14 \
  > $OUT/order.log 2>&1; echo "== order rc $? at $(( $(date +%s) - T_START )) s"
grep -E "^## |^\| nvjet|^\| _|^\| void cublas" $OUT/order.log | cut -c1-150

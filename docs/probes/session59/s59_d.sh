#!/usr/bin/env bash
# session 59, call D; carry .devrun. Either card: 1 the one run (session 52's command) with every run in a process of
# its own (--isolate: session 59 found stock ~10 % and tuned ~2 % slower after other runs in a process); 2 the 1.5B's
# batch-1 step, stock and tuned, isolated, in the time left. TOTAL: seconds of commands (default 540).
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json
END=${TOTAL:-540}
if [ $END -ge 380 ]; then cases=decode-1,decode-32,poisson,grpo,long,gemm; arms=stock,detent,tuned,det
  tokens=8192,long=16384; tuples=decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T; t=$(( END - 10 < 440 ? END - 10 : 440 ))
else cases=decode-1,decode-32; arms=stock,detent,tuned; tokens=8192; tuples=decode-1=$D1,decode-32=$T; t=$((END-10)); fi
timeout $t python3 -P -m detent_rl.bench --arms $arms --max-num-tokens $tokens \
  --stock-pdl on --rounds 1 --serves 5 --cases $cases --isolate \
  --commitment $tuples --out /tmp/all > /tmp/run.log 2>&1
echo "one run rc $? at $(( $(date +%s) - T_START )) s"; grep -v "^\s*$" /tmp/run.log | tail -3
cp /tmp/all/bench.md /tmp/all/bench.json /tmp/all/bench.png $OUT/ 2>/dev/null
grep -v "^\s*$" /tmp/all/bench.md | head -26
[ -f /tmp/all/bench.md ] || for f in /tmp/all/isolated/*/bench.md; do echo "$f"; grep -E '^\| (decode|poisson|grpo|long)' $f; done
left=$(( END - $(date +%s) + T_START ))
[ $left -gt 70 ] && timeout $left python3 -P -m detent_rl.bench --model qwen2-1.5b --arms stock,tuned \
  --commitment decode-1=$D15 --max-num-tokens 8192 --stock-pdl on --rounds 2 --cases decode-1 --isolate \
  --out /tmp/d15 > /tmp/d15.log 2>&1; echo "== 1.5B decode-1 rc $? at $(( $(date +%s) - T_START )) s"
grep -E '^\| decode-1|^device' /tmp/d15/bench.md 2>/dev/null; cp /tmp/d15/bench.md $OUT/d15.md 2>/dev/null
exit 0

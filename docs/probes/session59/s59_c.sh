#!/usr/bin/env bash
# session 59, call C; carry .devrun. On an H200: 1 the one run (session 52's command); 2 the fusion headroom of the
# 1.5B's tuned batch-1 step (launch_ablation_probe, D15); 3 the same for the 0.5B (D1); 4 decode-1 --isolate'd, in
# the time left. On an H100: s58_b.sh (the order check, then the headroom). TOTAL: seconds of commands (default 575).
set -u
T_START=$(date +%s)
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name())')
echo "card: $name"
case "$name" in *H200*) ;; *) exec bash .devrun/s58_b.sh ;; esac
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json; S=bench/tuned/h100_qwen2-0.5b_serve64_attention.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json
END=${TOTAL:-575}
left() { echo $(( END - $(date +%s) + T_START )); }
mkdir -p $OUT/all
timeout 330 python3 -P -m detent_rl.bench --arms stock,detent,tuned,det --max-num-tokens 8192,long=16384 \
  --stock-pdl on --rounds 1 --serves 5 --cases decode-1,decode-32,poisson,grpo,long,gemm \
  --commitment decode-1=$D1,decode-32=$T,poisson=$S,grpo=$T,long=$L,gemm=$T --out $OUT/all > /tmp/run.log 2>&1
echo "one run rc $? at $(( $(date +%s) - T_START )) s"; tail -3 /tmp/run.log
grep -v "^\s*$" $OUT/all/bench.md | head -24
l=$(left); [ $l -gt 170 ] && l=170
[ $l -gt 50 ] && timeout $l python3 -P bench/launch_ablation_probe.py --model qwen2-1.5b --commitment $D15 \
  --rounds 3 > $OUT/ablation_15.log 2>&1; echo "== 1.5B headroom rc $? at $(( $(date +%s) - T_START )) s"
tail -9 $OUT/ablation_15.log
l=$(left); [ $l -gt 110 ] && l=110
[ $l -gt 40 ] && timeout $l python3 -P bench/launch_ablation_probe.py --commitment $D1 --rounds 3 \
  > $OUT/ablation_05.log 2>&1; echo "== 0.5B headroom rc $? at $(( $(date +%s) - T_START )) s"
tail -9 $OUT/ablation_05.log
l=$(left)
[ $l -gt 60 ] && timeout $l python3 -P -m detent_rl.bench --arms stock,tuned --commitment decode-1=$D1 \
  --max-num-tokens 8192 --stock-pdl on --rounds 3 --cases decode-1 --isolate --out /tmp/iso > /tmp/iso.log 2>&1
echo "== isolated rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1' /tmp/iso/bench.md 2>/dev/null
cp /tmp/iso/bench.md $OUT/isolated.md 2>/dev/null; exit 0

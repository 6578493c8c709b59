#!/usr/bin/env bash
# session 54, call A (prepared in session 53). Run with wip/fixed-split checked out as the working tree (`new`), after
# `bash bench/rev_ab.sh --prepare 5e92f2a` (main, the branch's parent); carry .devrun.
# 1 decode-1 A/B (twice, alternating); 2 the branch's GPU tests; 3 decode-32/long A/B; 4 main's off,whole probe
set -u
T_START=$(date +%s); root=$(pwd)
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json
tree() { [ "$1" = new ] && echo . || echo .devrun/rev-$1; }
bench() {  # tag out limit args...
  local n=$1 o=$2 lim=$3; shift 3
  ( cd $(tree $n) && export PYTHONPATH=$(bash $root/bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-$n \
      PYTHONUNBUFFERED=1 && timeout $lim python3 -P -m detent_rl.bench --stock-pdl on --out /tmp/$o "$@" \
      > /tmp/$o.log 2>&1 )
  echo "== $n $o rc $? (at $(( $(date +%s) - T_START )) s)"
  grep -E '^\| (decode-1|decode-32|long) ' /tmp/$o/bench.md 2>/dev/null | cut -d'|' -f2-5 || tail -3 /tmp/$o.log
  [ -f /tmp/$o/bench.md ] && cp /tmp/$o/bench.md $OUT/$o.md
}
for i in 1 2; do
  for n in new 5e92f2a; do
    bench $n d1_${n}_$i 80 --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 --rounds 3 --cases decode-1
  done
done
( export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-new PYTHONUNBUFFERED=1 && cd tests &&
  timeout 220 python3 -P -m pytest -m gpu -v -p no:cacheprovider test_engine_invariance.py test_attention_plan_gpu.py \
    test_kernels_attention_gpu.py -k "invariance or plan or fixed_split or (pinned and qwen2) or stock or one_split" \
    2>&1 | grep -E "PASS|FAIL|Error|passed|failed" | tail -40 )
echo "tests done at $(( $(date +%s) - T_START )) s"
for n in new 5e92f2a; do
  [ $(( $(date +%s) - T_START )) -gt 480 ] && break
  bench $n bl_$n 60 --arms stock,detent,tuned --max-num-tokens 8192,long=16384 --commitment decode-32=$T,long=$L \
    --rounds 2 --cases decode-32,long
done
[ $(( $(date +%s) - T_START )) -lt 530 ] && bench 5e92f2a ow 60 --arms stock,tuned --commitment decode-1=$D1 \
  --max-num-tokens 8192 --rounds 3 --cases decode-1 --step-graphs off,whole
echo "total $(( $(date +%s) - T_START )) s"

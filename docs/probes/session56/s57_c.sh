#!/usr/bin/env bash
# session 57, call C (prepared in session 56), from wip/early-weights's checkout; carry .devrun. Weights before the
# PDL wait (the decode tiles' first block, RMSNorm's held rows), off (DETENT_EARLY_W=0) against on (the default),
# each in its own process, alternating: decode-1 0.5B twice, the 1.5B's decode-1, decode-32 with the long case. Each
# run's rows printed and its bench.md kept.
set -u
T_START=$(date +%s)
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-ew PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json; L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json
ab() {  # name limit bench-args...: early off, then on
  local name=$1 lim=$2; shift 2
  for mode in 0 ""; do
    local tag=ew${mode:-1}_$name
    DETENT_EARLY_W=$mode timeout $lim python3 -P -m detent_rl.bench --stock-pdl on --out /tmp/$tag "$@" \
      > /tmp/$tag.log 2>&1
    echo "== $tag rc $? (at $(( $(date +%s) - T_START )) s)"
    grep -E '^\| (decode-1|decode-32|long) ' /tmp/$tag/bench.md 2>/dev/null | cut -d'|' -f2-5 | sed "s/^/$tag /"
    cp /tmp/$tag/bench.md $OUT/$tag.md 2>/dev/null
  done
}
for i in 1 2; do
  ab d1_$i 80 --arms stock,detent,tuned --commitment decode-1=$D1 --max-num-tokens 8192 --rounds 3 --cases decode-1
done
ab d15 120 --model qwen2-1.5b --arms stock,tuned --commitment decode-1=$D15 --max-num-tokens 8192 --rounds 3 \
  --cases decode-1
[ $(( $(date +%s) - T_START )) -lt 420 ] && ab dl 75 --arms stock,detent,tuned --commitment decode-32=$T,long=$L \
  --max-num-tokens 8192,long=16384 --rounds 2 --cases decode-32,long
echo "total $(( $(date +%s) - T_START )) s"

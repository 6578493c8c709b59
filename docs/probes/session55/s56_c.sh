#!/usr/bin/env bash
# session 56, call C (prepared in session 55): wip/pdl-early-loads against main through bench/rev_ab.sh. Run with
# wip/pdl-early-loads checked out (the `main` tag below is that working tree), after `bash bench/rev_ab.sh
# --prepare 471ef94` (the branch's parent on main); carry .devrun. decode-1 0.5B twice alternating, then the 1.5B's
# decode-1, and decode-32 with the long case, once a tree; each tree's table rows printed, each bench.md kept.
set -u
T_START=$(date +%s)
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json; L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json
ab() {  # name limit bench-args...: both trees, then their rows
  local name=$1 lim=$2; shift 2
  bash bench/rev_ab.sh 471ef94 $lim -- python3 -P -m detent_rl.bench --stock-pdl on --out "/tmp/{tag}_$name" "$@" \
    > /tmp/ab_$name.log 2>&1
  echo "== $name rc $? (at $(( $(date +%s) - T_START )) s)"; grep "exited" /tmp/ab_$name.log
  for tag in main rev-471ef94; do
    grep -E '^\| (decode-1|decode-32|long) ' /tmp/${tag}_$name/bench.md 2>/dev/null | cut -d'|' -f2-5 | sed "s/^/$tag /"
    cp /tmp/${tag}_$name/bench.md $OUT/${tag}_$name.md 2>/dev/null
  done
}
for i in 1 2; do
  ab d1_$i 80 --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 --rounds 3 --cases decode-1
done
ab d15 120 --model qwen2-1.5b --arms stock,tuned --commitment decode-1=$D15 --max-num-tokens 8192 --rounds 3 \
  --cases decode-1
[ $(( $(date +%s) - T_START )) -lt 440 ] && ab dl 70 --arms stock,detent,tuned --commitment decode-32=$T,long=$L \
  --max-num-tokens 8192,long=16384 --rounds 2 --cases decode-32,long
echo "total $(( $(date +%s) - T_START )) s"

#!/usr/bin/env bash
# session 56, call C (prepared in session 55): wip/pdl-early-loads against main. Run with wip/pdl-early-loads checked
# out as the working tree (`new`), after `bash bench/rev_ab.sh --prepare MAIN` (MAIN: the branch's parent on main);
# carry .devrun. decode-1 0.5B twice alternating, then the 1.5B's decode-1, decode-32 and the long case once a tree.
set -u
T_START=$(date +%s); root=$(pwd)
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
D1=bench/tuned/h200_qwen2-0.5b_decode1.json; T=bench/tuned/h200_qwen2-0.5b_grpo32x8.json
D15=bench/tuned/h200_qwen2-1.5b_decode1.json; L=bench/tuned/h200_qwen2-0.5b_long2x12k_split512.json
REVS=$(ls -d .devrun/rev-* | sed 's/.*rev-//' | tr '\n' ' ')
tree() { [ "$1" = new ] && echo . || echo .devrun/rev-$1; }
bench() {  # tree out limit args...
  local n=$1 o=$2 lim=$3; shift 3
  ( cd $(tree $n) && export PYTHONPATH=$(bash $root/bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-$n \
      PYTHONUNBUFFERED=1 && timeout $lim python3 -P -m detent_rl.bench --stock-pdl on --out /tmp/$o "$@" \
      > /tmp/$o.log 2>&1 )
  echo "== $n $o rc $? (at $(( $(date +%s) - T_START )) s)"
  grep -E '^\| (decode-1|decode-32|long) ' /tmp/$o/bench.md 2>/dev/null | cut -d'|' -f2-5 || tail -3 /tmp/$o.log
  [ -f /tmp/$o/bench.md ] && cp /tmp/$o/bench.md $OUT/$o.md
}
for i in 1 2; do
  for n in new $REVS; do
    bench $n d1_${n}_$i 80 --arms stock,tuned --commitment decode-1=$D1 --max-num-tokens 8192 --rounds 3 --cases decode-1
  done
done
for n in new $REVS; do
  bench $n d15_$n 120 --model qwen2-1.5b --arms stock,tuned --commitment decode-1=$D15 --max-num-tokens 8192 \
    --rounds 3 --cases decode-1
done
for n in new $REVS; do
  [ $(( $(date +%s) - T_START )) -gt 470 ] && break
  bench $n dl_$n 70 --arms stock,detent,tuned --commitment decode-32=$T,long=$L --max-num-tokens 8192,long=16384 \
    --rounds 2 --cases decode-32,long
done
echo "total $(( $(date +%s) - T_START )) s"

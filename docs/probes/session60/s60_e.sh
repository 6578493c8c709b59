#!/usr/bin/env bash
# session 60, for a short budget; carry .devrun. Batch-1 decode only, every arm in its own process (the default):
# goal = stock, detent, tuned on D1 (the 0.5B batch-1 goal's figure; first on an H200); ab05 / ab15 = stock, detent,
# and `tuned` as the default tuple with wip/tile32-default's M <= 16 rule written in (.devrun/t32_tuple.py ... rule).
# TOTAL: seconds of commands (default 300).
set -u
T_START=$(date +%s); END=${TOTAL:-300}
export PYTHONPATH=$(bash bench/link_package.sh .) DETENT_CACHE_DIR=/tmp/selir-main PYTHONUNBUFFERED=1
name=$(python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())')
echo "$name"
D1=bench/tuned/h200_qwen2-0.5b_decode1.json
bench() {  # name model tuple rounds
  local left=$(( END - $(date +%s) + T_START )); [ $left -gt 50 ] || { echo "== $1 skipped"; return; }
  case $3 in /tmp/t32_*) python3 -P .devrun/t32_tuple.py $2 rule $3 cuda | tail -1 ;; esac
  left=$(( END - $(date +%s) + T_START ))
  timeout $left python3 -P -m detent_rl.bench --model $2 --arms stock,detent,tuned --max-num-tokens 8192 \
    --stock-pdl on --rounds $4 --cases decode-1 --commitment decode-1=$3 --out /tmp/$1 > /tmp/$1.log 2>&1
  echo "== $1 rc $? at $(( $(date +%s) - T_START )) s"; grep -E '^\| decode-1|^device' /tmp/$1/bench.md
  cp /tmp/$1/bench.md $OUT/$1.md 2>/dev/null || { tail -3 /tmp/$1.log; for f in /tmp/$1/isolated/*/bench.md; do
    echo "$f"; grep -E '^\| decode-1' $f; done; }
}
case "$name" in
  *H200*) bench goal qwen2-0.5b $D1 1; bench ab05 qwen2-0.5b /tmp/t32_05.json 1; bench ab15 qwen2-1.5b /tmp/t32_15.json 1 ;;
  *) bench ab05 qwen2-0.5b /tmp/t32_05.json $(( END < 200 ? 1 : 2 )); bench ab15 qwen2-1.5b /tmp/t32_15.json 1 ;;
esac
exit 0

#!/usr/bin/env bash
# session 59, call A (prepared in session 58, which got no machine); carry .devrun. On an H200: the one run, then
# decode-1 --isolate'd (s58_h200.sh). On an H100: the order check and the fusion headroom (s58_b.sh). TOTAL: the
# seconds of commands to plan for (default 575).
name=$(python3 -c 'import torch; print(torch.cuda.get_device_name())')
echo "card: $name"
case "$name" in *H200*) exec bash .devrun/s58_h200.sh ;; esac
exec bash .devrun/s58_b.sh

#!/usr/bin/env bash
# session 60, first call; carry .devrun. On an H200 the owed one run (s59_d.sh: every case, each arm isolated, then
# the 1.5B's batch-1 step); on any other card the default tuple's tile A/B (s60_b.sh), which needs no particular card.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $name"
case "$name" in *H200*) TOTAL=${TOTAL:-540} bash .devrun/s59_d.sh ;; *) TOTAL=${TOTAL:-540} bash .devrun/s60_b.sh ;; esac

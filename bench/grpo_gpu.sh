#!/usr/bin/env bash
# GRPO runs on a GPU machine without network or Ray (the device): the loop runs with
# `ray.mode=inline`, packages it lacks arrive as carried wheels, SmolLM2's GGUF in parts.
# State lives under $DETENT_DEVICE_HOME (default ~/detent) and survives back-to-back calls.
# Usage, from the repository root:
#   bash bench/grpo_gpu.sh setup WHEEL_DIR...    install the wheels (and sdists) of those folders
#                                                whose distributions python3 lacks, into <home>/site
#   bash bench/grpo_gpu.sh part FILE...          keep these parts of SmolLM2's GGUF in <home>/smol
#   bash bench/grpo_gpu.sh smollm2 SHA256        join the parts (name order), check the sha256,
#                                                convert into the models cache (models.gguf)
#   bash bench/grpo_gpu.sh run NAME RECIPE [key=value...]
#                                                python -m detent_rl.train RECIPE in <home>/runs/NAME,
#                                                then its report; the run (no checkpoints) comes back
#                                                as $OUT/NAME.tgz. RAY_MODE=ray runs it on a local Ray
#                                                (carried: bench/multi_gpu_wheels.sh); default inline
set -uo pipefail
root=$(pwd)
home=${DETENT_DEVICE_HOME:-$HOME/detent}
out=${OUT:-/tmp/grpo_gpu}
mkdir -p "$home/site" "$out"
pkg=$(bash "$root/bench/link_package.sh" "$root")  # no pip install -e on the device
export PYTHONPATH="$pkg:$home/site" PYTHONUNBUFFERED=1
export DETENT_MODELS_DIR=$home/models DETENT_CACHE_DIR=$home/selir-cache

case "${1:-}" in
setup)
    shift
    python3 - "$home/site" "$@" <<'EOF' || exit
import importlib.metadata as md, pathlib, subprocess, sys
site, dirs = sys.argv[1], sys.argv[2:]
for path in sorted(p for d in dirs for p in pathlib.Path(d).iterdir()):
    name = path.name.split("-")[0]
    try:
        print(f"have {name} {md.version(name)}")
        continue
    except md.PackageNotFoundError:
        pass
    build = [] if path.suffix == ".whl" else ["--no-build-isolation"]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir",
                           "--upgrade", "--target", site, *build, str(path)]).returncode == 0
    print(f"{'installed' if done else 'FAILED to install'} {path.name}")
EOF
    ;;
part)
    shift
    mkdir -p "$home/smol" && cp -v "$@" "$home/smol/"
    ;;
smollm2)
    cat "$home"/smol/* > "$home/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$2  $home/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit
    python3 -P -m detent_rl.models.gguf "$home/SmolLM2-135M-Instruct.Q4_1.gguf" "$DETENT_MODELS_DIR/smollm2-135m-instruct"
    ;;
run)
    name=$2 recipe=$3
    shift 3
    tb=false
    python3 -c "import tensorboard" 2>/dev/null && tb=true
    dir=$home/runs/$name
    rm -rf "$dir" && mkdir -p "$dir"
    start=$(date +%s)
    timeout "${RUN_TIMEOUT:-0}" python3 -P -m detent_rl.train "$recipe" run.dir="$dir" ray.mode="${RAY_MODE:-inline}" \
        checkpoint.every="${CHECKPOINT_EVERY:-0}" \
        log.progress=false log.tensorboard=$tb "$@" 2>&1 | tee "$dir/train.log"
    status=${PIPESTATUS[0]}
    echo "== $name: exit $status, $(( $(date +%s) - start )) s wall" | tee -a "$dir/train.log"
    python3 -P -m detent_rl.report "$dir" >/dev/null 2>&1 || echo "report of $name failed"
    tar -C "$home/runs" --exclude=checkpoints -czf "$out/$name.tgz" "$name"
    exit "$status"
    ;;
*)
    sed -n 2,16p "$0"
    exit 2
    ;;
esac

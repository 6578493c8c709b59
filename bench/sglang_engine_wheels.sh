#!/usr/bin/env bash
# The torch-2.11 SGLang stack for `rollout.backend: sglang` end to end on the H200 (issue 12): sglang 0.5.17
# with its CUDA kernels (sglang-kernel 0.4.5, built against torch 2.11, which the device has), for the
# device's Python 3.12, in parts of under 64 MiB that back-to-back `run` calls carry into ~/whl while the
# machine stays warm (30 s idle). Ran on the device in session 26 (docs/BENCHMARKS.md): the engine started with
# the plugin and tests/test_sglang_engine_gpu.py passed. Before carrying a new release, bench/sglang_import_walk.py
# finds on the CPU the modules its CUDA branches import.
#
# What goes beyond the device image (torch 2.11, triton 3.6, transformers 5.17, huggingface_hub 1.33,
# httpx, uvloop, numpy, ...): the modules bench/sglang_device_common.sh lists, with 0.5.17's
# own needs instead of 0.5.23's:
#   - transformers 5.12.1 and tokenizers 0.22.2: 0.5.17 registers a config name that transformers >= 5.13
#     (the device's 5.17 too) already holds, without exist_ok, and fails at import;
#   - kernels 0.14.1 and xgrammar 0.2.1 (its server_args imports both);
#   - what its engine, scheduler, tokenizer and detokenizer managers, model runner and Qwen2 model import
#     at module level (an import walk on the CPU, tests/sglang_stubs standing in for sgl_kernel):
#     fastapi, uvicorn, setproctitle, opentelemetry's api, sdk and semantic conventions;
#   - sgl_kernel itself without FA3 and the sm100 build: the wheel is 383 MB, nearly all of it
#     `flash_ops.abi3.so` (1.12 GB unpacked), which sgl_kernel loads only through `sgl_kernel.flash_attn`
#     (SGLang's FA3 backend, which the worker does not use: it runs the Triton backend). It travels as a
#     tarball of the package folders, unpacked into the same --target folder.
#
#   bash bench/sglang_engine_wheels.sh               # here, once: prints the parts and their sizes
#   run(carry=[".whl/engine1"], command="mkdir -p ~/whl && cp .whl/engine1/* ~/whl/")
#   run(carry=[".whl/engine2"], command="cp .whl/engine2/* ~/whl/")   # ... one call a part
#   run(carry=[".whl/engineN"], command="cp .whl/engineN/* ~/whl/ && bash bench/sglang_engine_wheels.sh --install \
#       ~/whl /tmp/site && python3 -m pip install --no-deps --no-build-isolation --no-index -e . && \
#       export PYTHONPATH=/tmp/site && cd tests && python3 -m pytest -m gpu test_sglang_engine_gpu.py")
# (detent_rl installed before /tmp/site is on the path: kernels 0.14.1's setuptools hook breaks the editable build)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--install" ]; then  # on the device: every wheel and the trimmed sgl_kernel into $3
    src=$2 target=$3
    mkdir -p "$target"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" \
        "$src"/*.whl
    tar -xzf "$src"/sgl_kernel_sm90.tar.gz -C "$target"
    echo "installed into $target: $(ls "$target" | wc -l) entries"
    exit 0
fi

out=.whl/engine-all
rm -rf .whl/engine-all .whl/engine[0-9]*
mkdir -p "$out"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# shellcheck source=bench/sglang_device_common.sh
. bench/sglang_device_common.sh
# 0.5.17 pins openai 2.6.1 (the 0.5.23 list's openai 3.57 imports httpx2, which the device lacks), with jiter and
# distro; kernels 0.14.1 needs kernels-data; on CUDA its fp8 utilities import flashinfer at module level (0.5.17 pins
# 0.6.15.post1; its other imports the device has: cuda-bindings, nvidia-ml-py, click, tabulate). Found by importing
# the engine's modules in a virtual environment with torch.cuda patched to report an sm_90 device.
download_for_device "$out" sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 kernels==0.14.1 kernels-data \
    flashinfer_python==0.6.15.post1 \
    xgrammar==0.2.1 fastapi uvicorn setproctitle opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions \
    openai==2.6.1 jiter distro ${SGLANG_LIGHT_DEPS/openai==3.57.0/} sglang-kernel==0.4.5

# sgl_kernel without FA3 (flash_ops) and the sm100 build, as a tarball of its package folders
kernel=$(ls "$out"/sglang_kernel-0.4.5-*.whl)
unpack=$(mktemp -d)
python3 -m zipfile -e "$kernel" "$unpack"
rm -rf "$unpack"/sgl_kernel/flash_ops.abi3.so "$unpack"/sgl_kernel/sm100
(cd "$unpack" && tar -czf sgl_kernel_sm90.tar.gz sgl_kernel triton_kernels sglang_kernel-0.4.5.dist-info)
mv "$unpack"/sgl_kernel_sm90.tar.gz "$out"/
rm -rf "$unpack" "$kernel"

# parts of at most 58 MiB, largest files first (first fit)
python3 - "$out" <<'EOF'
import os, shutil, sys
out = sys.argv[1]
limit = 58 << 20  # a call carries 64 MiB with the working tree (~2.4 MB)
files = sorted(os.listdir(out), key=lambda f: -os.path.getsize(os.path.join(out, f)))
parts = []
for f in files:
    size = os.path.getsize(os.path.join(out, f))
    if size > limit:
        sys.exit(f"{f} is {size >> 20} MiB, over a call's {limit >> 20} MiB")
    for part in parts:
        if part[0] + size <= limit:
            part[0] += size
            part[1].append(f)
            break
    else:
        parts.append([size, [f]])
for i, (size, names) in enumerate(parts, 1):
    folder = os.path.join(os.path.dirname(out), f"engine{i}")
    os.makedirs(folder)
    for name in names:
        shutil.move(os.path.join(out, name), folder)
    print(f"{folder}: {len(names)} files, {size / 2**20:.1f} MiB")
shutil.rmtree(out)
EOF

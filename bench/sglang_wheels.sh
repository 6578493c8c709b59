#!/usr/bin/env bash
# The wheels that SGLang 0.5.23's Triton ops, its Triton attention backend, hook registry, sampling and
# fused-MoE config modules (and detent_rl's plugin) import, beyond what the H200 device image has
# (torch, triton, transformers, accelerate): found by importing them in a virtual environment of only
# those, one missing module at a time, then by the device itself (pydantic and what it needs, psutil,
# rich: present in a local virtual environment, absent there). sgl_kernel (SGLang's CUDA kernels) is
# not among them: the tests' import stub stands in (tests/sglang_stubs/sgl_kernel). Downloaded here for the device's Python 3.12, x86-64, into .whl/
# (ignored by git), to travel with `carry`. transformers 5.24 rides along: the device's 5.17 refuses
# SGLang's image-processor registration at import without torchvision. 77 MB in all, over the 64 MiB a
# call carries: SGLang's own wheel (39 MB) goes in .whl/sglang, the rest (38 MB) in .whl/deps, and two
# back-to-back calls (the machine stays warm 30 s) carry one each into ~/whl, where the second installs:
#
#   bash bench/sglang_wheels.sh                                      # here, once
#   run(carry=[".whl/sglang"], command="mkdir -p ~/whl && cp .whl/sglang/*.whl ~/whl/ && ...other work...")
#   run(carry=[".whl/deps"], command="cp .whl/deps/*.whl ~/whl/ && python3 -m pip install -q --no-index \
#       --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ~/whl/*.whl && \
#       export PYTHONPATH=/tmp/site:$(bash bench/link_package.sh .) && python3 -P -m pytest -m gpu \
#       tests/test_sglang_gpu.py && python3 -P bench/sglang_kernels_bench.py")
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/sglang .whl/deps
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# shellcheck source=bench/sglang_device_common.sh
. bench/sglang_device_common.sh
# SGLang 0.5.23's own needs beside the shared list: transformers 5.24, whose huggingface-hub imports httpx2
download_for_device .whl/deps sglang==0.5.23 transformers==5.24.0 httpx2==2.16.2 $SGLANG_LIGHT_DEPS
mv .whl/deps/sglang-*.whl .whl/sglang/
du -sh .whl/sglang .whl/deps

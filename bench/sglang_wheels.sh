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
PKGS="sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 transformers==5.24.0
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 attrs==26.1.0 dill==0.4.1 einops==0.8.2
frozenlist==1.8.0 gguf==0.19.0 httpx2==2.16.2 ipython==9.18.1 loguru==0.7.3 msgspec==0.23.0 multidict==7.2.1
openai==3.57.0 orjson==3.13.0 partial_json_parser==0.2.1.1.post7 pillow==13.0.0 propcache==0.5.4 pybase64==1.5.1
pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3 sniffio==1.3.1 starlette==1.10.0 traitlets==5.16.1
urllib3==2.8.0 yarl==1.25.1
annotated-types==0.8.0 anyio==4.16.0 certifi==2026.10.19.post1 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1
idna==3.20 markdown-it-py==4.3.0 mdurl==0.1.2 psutil==7.2.2 pydantic==2.14.4 pydantic_core==2.50.5
Pygments==2.21.0 rich==15.0.0 typing-inspection==0.4.5"
for p in $PKGS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 -d .whl/deps "$p"
done
mv .whl/deps/sglang-*.whl .whl/sglang/
du -sh .whl/sglang .whl/deps

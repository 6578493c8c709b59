#!/usr/bin/env bash
# The packages the multi-GPU runs of issue 13 need beyond the device image (torch, triton, transformers,
# accelerate and what they pull: filelock, numpy, packaging, psutil, pyyaml, requests, tqdm): Ray 2.60
# with its own requirements (click, jsonschema and what it needs, msgpack, protobuf) and DeepSpeed 0.19.8
# (an sdist, built there with DS_BUILD_OPS=0 --no-build-isolation: bench/grpo_gpu.sh setup does that)
# with its own (einops, hjson, ninja, py-cpuinfo, pydantic and what it needs). Downloaded here for the
# device's Python 3.12, x86-64, into .whl/ (ignored by git), to travel with `carry`. Ray's wheel (~79 MB)
# is over the 64 MiB a call carries: it is split into two parts (.whl/ray1, .whl/ray2) that two
# back-to-back calls (the machine stays warm 30 s) copy to ~/whl/parts; the second call joins them and
# installs everything (.whl/mgdeps travels with the first):
#
#   bash bench/multi_gpu_wheels.sh                                    # here, once
#   run(kind="nvidia-h200-x2", carry=[".whl/ray1", ".whl/mgdeps"],
#       command="mkdir -p ~/whl/parts ~/whl/all && cp .whl/ray1/* ~/whl/parts/ && cp .whl/mgdeps/* ~/whl/all/")
#   run(carry=[".whl/ray2"], command="cp .whl/ray2/* ~/whl/parts/ && bash bench/multi_gpu_wheels.sh join && \
#       DS_BUILD_OPS=0 bash bench/grpo_gpu.sh setup ~/whl/all && ...the runs (docs/BENCHMARKS.md, issue 13)...")
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = join ]; then  # on the device: the Ray wheel from its parts, beside the others
    name=$(cat ~/whl/parts/NAME)
    cat ~/whl/parts/part.* > ~/whl/all/"$name"
    (cd ~/whl/all && sha256sum -c ~/whl/parts/SHA256)
    exit 0
fi
mkdir -p .whl/ray1 .whl/ray2 .whl/mgdeps
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PKGS="ray==2.60.0 click==8.3.1 jsonschema==4.25.1 jsonschema-specifications==2025.9.1 referencing==0.37.0
rpds-py==0.30.0 attrs==25.4.0 msgpack==1.1.2 protobuf==6.33.1 einops==0.8.1 hjson==3.1.0 ninja==1.13.0
py-cpuinfo==9.0.0 pydantic==2.12.5 pydantic_core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2"
tmp=$(mktemp -d)
for p in $PKGS; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
        -d "$tmp" "$p"
done
python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" deepspeed==0.19.8
ray=$(cd "$tmp" && ls ray-*.whl)
(cd "$tmp" && sha256sum "$ray" > SHA256 && split -b 50000000 "$ray" part.)
echo "$ray" > "$tmp/NAME"
cp "$tmp"/part.aa "$tmp"/NAME "$tmp"/SHA256 .whl/ray1/
cp "$tmp"/part.a[b-z] .whl/ray2/
find "$tmp" -maxdepth 1 \( -name '*.whl' -o -name '*.tar.gz' \) ! -name 'ray-*' -exec cp {} .whl/mgdeps/ \;
rm -rf "$tmp"
du -sh .whl/ray1 .whl/ray2 .whl/mgdeps

# Sourced by bench/sglang_wheels.sh and bench/sglang_engine_wheels.sh: the pure-Python and small compiled
# modules SGLang's imports reach beyond the H200 device image (found by importing SGLang in a virtual
# environment of only what the image holds, one missing module at a time, then on the device itself),
# and the download of wheels for the device's Python 3.12 on x86-64.
SGLANG_LIGHT_DEPS="apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 attrs==26.1.0 dill==0.4.1 einops==0.8.2
frozenlist==1.8.0 gguf==0.19.0 ipython==9.18.1 loguru==0.7.3 msgspec==0.23.0 multidict==7.2.1
openai==3.57.0 orjson==3.13.0 partial_json_parser==0.2.1.1.post7 pillow==13.0.0 propcache==0.5.4 pybase64==1.5.1
pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3 sniffio==1.3.1 starlette==1.10.0 traitlets==5.16.1
urllib3==2.8.0 yarl==1.25.1
annotated-types==0.8.0 anyio==4.16.0 certifi==2026.10.19.post1 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1
idna==3.20 markdown-it-py==4.3.0 mdurl==0.1.2 psutil==7.2.2 pydantic==2.14.4 pydantic_core==2.50.5
Pygments==2.21.0 rich==15.0.0 typing-inspection==0.4.5"

# download_for_device DEST PKG...: each package's wheel, no dependencies, for CPython 3.12 on manylinux x86-64
download_for_device() {
    local dest=$1 p
    shift
    for p in "$@"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
            --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 -d "$dest" "$p"
    done
}

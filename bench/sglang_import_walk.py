"""Which modules SGLang's engine imports that a machine lacks, found on a CPU before device time is spent.

SGLang picks many imports by platform at import time (`is_cuda()` and friends read torch.cuda), so a
plain import walk on a CPU misses what the device's CUDA branches pull in: session 26 carried the
0.5.17 stack to the H200 and the engine failed at `from flashinfer import bmm_fp8`, imported only on
CUDA. This walk imports the engine's modules with torch.cuda patched to report one sm_90 device and
prints each missing module with the file that imported it. Run it in a virtual environment holding only
what the device image has plus what `bench/sglang_engine_wheels.sh` carries (CPU builds of each):

    python3 -m venv /tmp/walk && . /tmp/walk/bin/activate
    pip install torch==2.13.0 && pip install --no-deps <the device image's packages> <the carried wheels' names>
    python bench/sglang_import_walk.py

The tests' stand-ins for sgl_kernel and torchvision (tests/sglang_stubs) go first on the path: neither
loads on a CPU here. Nothing runs on a GPU; a module that touches the driver while importing shows as
an error, not as missing.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "sglang_stubs")
ENGINE_MODULES = (  # what sgl.Engine's processes import to serve a dense model on the Triton backend
    "sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager", "sglang.srt.managers.tp_worker",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_loader.loader", "sglang.srt.models.qwen2", "sglang.srt.models.llama",
    "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.sampler", "sglang.srt.layers.logits_processor",
    "sglang.srt.layers.linear", "sglang.srt.layers.layernorm", "sglang.srt.layers.activation",
    "sglang.srt.layers.rotary_embedding", "sglang.srt.layers.vocab_parallel_embedding", "sglang.srt.server_args",
)


def pretend_cuda(capability: tuple[int, int]) -> None:
    """torch.cuda reports one device of `capability` (imports only: nothing may launch)."""
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda *a, **k: capability
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
    torch.version.cuda = torch.version.cuda or "13.0"


def walk(modules: tuple[str, ...]) -> set[str]:
    """The missing modules' names; prints each with the engine module that led there and the importing file."""
    missing: set[str] = set()
    for name in modules:
        try:
            importlib.import_module(name)
            print(f"ok       {name}")
        except ModuleNotFoundError as e:
            where = traceback.extract_tb(e.__traceback__)[-1].filename.split("site-packages/")[-1]
            missing.add(e.name or "?")
            print(f"MISSING  {e.name} (from {name}, imported by {where})")
        except Exception as e:  # noqa: BLE001 - reported, the walk goes on
            frame = traceback.extract_tb(e.__traceback__)[-1]
            print(f"ERROR    {name}: {type(e).__name__}: {str(e)[:160]} "
                  f"({frame.filename.split('site-packages/')[-1]}:{frame.lineno})")
    return missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capability", default="9.0", help="the compute capability torch.cuda reports (default 9.0)")
    ap.add_argument("--cpu", action="store_true", help="walk without pretending a GPU (the CPU branches)")
    ap.add_argument("modules", nargs="*", help=f"modules to import (default: {len(ENGINE_MODULES)} of the engine's)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(STUBS))
    if not args.cpu:
        major, minor = (int(p) for p in args.capability.split("."))
        pretend_cuda((major, minor))
    missing = walk(tuple(args.modules) or ENGINE_MODULES)
    print(f"\n{len(missing)} missing: " + (", ".join(sorted(missing)) or "none"))
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()

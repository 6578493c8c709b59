"""Every selection program with the reference deployments it is solved for in reports and tests."""
from __future__ import annotations

import importlib
from typing import Any

_MODULES = (
    "detent_rl.kernels.programs.attention",
    "detent_rl.kernels.programs.matmul",
    "detent_rl.kernels.programs.moe",
    "detent_rl.kernels.programs.allreduce",
    "detent_rl.kernels.programs.rows",
    "detent_rl.kernels.programs.sglang.triton_decode",
    "detent_rl.kernels.programs.sglang.fa3",
    "detent_rl.kernels.programs.sglang.moe_config",
    "detent_rl.kernels.programs.sglang.custom_allreduce_v2",
)


def programs() -> dict[str, tuple[Any, dict[str, dict]]]:
    """name -> (program, {deployment name: facts}); a module's main program shares its name."""
    from detent_rl.selir.program import Program
    out: dict[str, tuple[Any, dict[str, dict]]] = {}
    for modname in _MODULES:
        mod = importlib.import_module(modname)
        if hasattr(mod, "PROGRAMS"):  # a module of several families
            out.update(mod.PROGRAMS)
            continue
        deployments = getattr(mod, "DEPLOYMENTS", None) or {"reference": mod.REFERENCE_FACTS}
        prog = getattr(mod, "PROGRAM", None) or getattr(mod, modname.rsplit(".", 1)[1])
        if not isinstance(prog, Program):
            raise TypeError(f"{modname} does not expose its selection program")
        prefix = "sglang." if ".sglang." in modname else ""
        out[prefix + prog.name] = (prog, deployments)
    return out

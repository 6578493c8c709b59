"""Import stub of sgl_kernel (SGLang's compiled CUDA kernel package) for the SGLang tests on a GPU
machine without it (tests/sglang_env.py puts this folder last on sys.path, so an installed
sgl_kernel wins). On CUDA, SGLang's quantization and layer modules import sgl_kernel's ops and
submodules at module level (`from sgl_kernel import int8_scaled_mm`, `from sgl_kernel.quantization
import ...`) on the way to the Triton attention backend; the code under test (SGLang's Triton decode
and extend kernels, its backend's split choice) never calls them. Every name imported from here or
from a submodule is a stand-in whose call raises, naming it: a tested path that did reach
sgl_kernel fails loudly instead of running something else."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0+detent.stub"


class _Missing:
    """A name of sgl_kernel: its attributes are more such names (SGLang reads constants such as
    `scalar_types.uint4b8` at import); calling one raises, naming it."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> "_Missing":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._path} was called, but sgl_kernel is the tests' import stub "
                           f"(tests/sglang_stubs/sgl_kernel): install SGLang's sgl-kernel for this path")

    def __repr__(self) -> str:
        return f"<sgl_kernel stub {self._path}>"


def _missing(module: str, name: str) -> _Missing:
    return _Missing(f"{module}.{name}")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(__name__, name)


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any `sgl_kernel.<sub>` import: a module like this one (every attribute a raising function)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attr(name: str, _module=spec.name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _missing(_module, name)
        module.__getattr__ = attr
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Submodules) for f in sys.meta_path):
    sys.meta_path.append(_Submodules())

"""The distribution installs only under the detent_rl namespace, transformers is not confused, and
every third-party module that the code or the tests import is declared in pyproject.toml."""
from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("kernels", "trainer", "rollout", "selir")
PRODUCTION = ("detent_rl", "kernels", "rollout", "trainer", "selir")
# Import names whose distribution is named otherwise, for when it is not installed here (installed
# ones are looked up with importlib.metadata.packages_distributions()).
IMPORT_TO_DIST = {"yaml": "pyyaml", "PIL": "pillow"}
# Submodules that import a distribution other than their top-level one's.
SUBMODULE_NEEDS = {"torch.utils.tensorboard": "tensorboard"}


def _probe(code: str, cwd: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_subpackages_import_under_detent_rl():
    import detent_rl.kernels
    import detent_rl.rollout
    import detent_rl.selir
    import detent_rl.trainer

    assert Path(detent_rl.selir.__file__).parent == REPO / "selir"
    assert Path(detent_rl.kernels.__file__).parent == REPO / "kernels"
    assert Path(detent_rl.rollout.__file__).parent == REPO / "rollout"
    assert Path(detent_rl.trainer.__file__).parent == REPO / "trainer"


INSTALLED = {"site-packages", "dist-packages"}  # the folders an environment installs packages into


def _ours(origin: str | None) -> bool:
    """Whether a module's file lies in this checkout (by path, not by string prefix: a virtual environment beside
    the checkout, /x/repo-venv beside /x/repo, is not in it) and not in what an environment there installed (a
    `python -m venv .venv` inside the checkout holds the hub's `kernels`, which is not ours)."""
    if origin is None:
        return False
    path = Path(origin).resolve()
    return path.is_relative_to(REPO) and not INSTALLED & set(path.relative_to(REPO).parts)


def test_ours_tells_the_checkout_from_an_environment_in_or_beside_it():
    assert _ours(str(REPO / "kernels" / "__init__.py"))
    assert not _ours(str(REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "kernels" / "__init__.py"))
    assert not _ours(str(REPO.parent / (REPO.name + "-venv") / "kernels" / "__init__.py"))
    assert not _ours(None)


def test_install_provides_no_top_level_kernels_trainer_rollout(tmp_path):
    # From a neutral directory the interpreter sees only what was installed.
    code = ("import importlib.util, json; "
            f"print(json.dumps({{n: getattr(importlib.util.find_spec(n), 'origin', None) for n in {TOP_LEVEL!r}}}))")
    found = _probe(code, tmp_path)
    for name, origin in found.items():
        assert not _ours(origin), f"installing detent-rl exposed top-level {name}: {origin}"
    assert importlib.metadata.distribution("detent-rl").metadata["Name"] == "detent-rl"


def _hub_kernels_installed() -> bool:
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# `python -c` puts "" (the working directory) first on sys.path; `python -m` puts its absolute path there.
_ROOT_ON_PATH = {"-c": "", "-m": "import sys; sys.path.insert(0, {root!r}); "}


@pytest.mark.parametrize("where", ["neutral", "repo-root -c", "repo-root -m"])
def test_transformers_imports_cleanly_beside_us(tmp_path, where):
    # transformers probes for HuggingFace's `kernels` hub package (>= 5.25 requires it and imports it by
    # name when loading a tokenizer or a model); ours must never answer, not even when the repository
    # root is the working directory (`python -m detent_rl.train` from the checkout: CI's failure).
    prefix = _ROOT_ON_PATH[where.split()[-1]].format(root=str(REPO)) if where != "neutral" else ""
    code = (prefix + "import importlib.util, json, detent_rl.kernels, transformers; "
            "from transformers.utils.import_utils import is_kernels_available; "
            "from transformers import LlamaConfig, LlamaForCausalLM; "
            "m = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, "
            "num_attention_heads=2, num_key_value_heads=1, vocab_size=64)); "
            "hub = is_kernels_available(); "
            "names = __import__('kernels').__dict__ if hub else {}; "
            "origin = getattr(importlib.util.find_spec('kernels'), 'origin', None); "
            "print(json.dumps({'hub_kernels': hub, 'origin': origin, 'CUDAProperties': 'CUDAProperties' in names}))")
    found = _probe(code, REPO if where != "neutral" else tmp_path)
    origin = found["origin"]
    assert not _ours(origin), f"top-level `kernels` resolved to our folder: {origin}"
    if _hub_kernels_installed():
        assert found["hub_kernels"] is True and found["CUDAProperties"], found
    else:
        assert found["hub_kernels"] is False, "transformers mistook our kernels folder for the hub package"


@pytest.mark.parametrize("flag", ["-c", "-m"])
def test_the_repo_root_shadows_without_the_guard(flag):
    # Negative control for the test above: before detent_rl is imported, the root that `python -c` and
    # `python -m` put on sys.path does answer `import kernels` with our folder; importing detent_rl is
    # what takes it off.
    code = (_ROOT_ON_PATH[flag].format(root=str(REPO)) + "import importlib.util, json; "
            "before = importlib.util.find_spec('kernels').origin; import detent_rl; "
            "after = getattr(importlib.util.find_spec('kernels'), 'origin', None); "
            "print(json.dumps({'before': before, 'after': after}))")
    found = _probe(code, REPO)
    assert found["before"] == str(REPO / "kernels" / "__init__.py"), found
    assert not _ours(found["after"]), found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement ("triton>=3.6; platform_system == 'Linux'" -> "triton")."""
    return _normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import in source: `import x.y`, `from x.y import z`,
    inside functions and `if TYPE_CHECKING:` blocks too, and importlib.import_module("x") / __import__("x")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def undeclared_imports(files: dict[str, str], declared: set[str], local: set[str]) -> list[str]:
    """"path:line: module (needs dist)" for every import in files (path -> source) that is neither
    stdlib nor a local name, and whose distribution is not among declared (normalised names)."""
    installed = importlib.metadata.packages_distributions()
    missing = []
    for path, source in files.items():
        for line, module in imported_modules(source):
            top = module.split(".")[0]
            needs = []  # each entry: the distributions of which one must be declared
            if top not in sys.stdlib_module_names and top not in local:
                needs.append({_normalise(d) for d in installed.get(top) or [IMPORT_TO_DIST.get(top, top)]})
            needs += [{_normalise(d)} for sub, d in SUBMODULE_NEEDS.items()
                      if module == sub or module.startswith(sub + ".")]
            missing += [f"{path}:{line}: {module} (needs {' or '.join(sorted(alts))})"
                        for alts in needs if not alts & declared]
    return missing


def _declared() -> tuple[set[str], set[str]]:
    """(the dependencies and the genuinely optional extras such as [sglang], that plus [dev]): the
    code may import the first, the tests both. The README's own commands are proven by .ci/run."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    base = {_dist_name(r) for r in project["dependencies"]}
    base |= {_dist_name(r) for name, reqs in extras.items() if name != "dev" for r in reqs}
    return base, base | {_dist_name(r) for r in extras.get("dev", [])}


def _sources(paths) -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in paths}


def test_every_imported_module_is_declared():
    base, with_dev = _declared()
    production = _sources(p for folder in PRODUCTION for p in sorted((REPO / folder).rglob("*.py")))
    tests = _sources(sorted((REPO / "tests").rglob("*.py")))
    test_helpers = {p.stem for p in (REPO / "tests").iterdir() if p.suffix == ".py" or p.is_dir()}
    # The scan sees what it must: every folder, and the imports made inside functions (these are).
    assert len(production) > 50 and len(tests) > 30
    seen = {m for source in production.values() for _, m in imported_modules(source)}
    assert {"matplotlib", "reasoning_gym", "torch.utils.tensorboard"} <= seen | {m.split(".")[0] for m in seen}
    missing = (undeclared_imports(production, base, {"detent_rl"})
               + undeclared_imports(tests, with_dev, {"detent_rl"} | test_helpers))
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(missing)


def test_undeclared_import_is_reported():
    # Negative control: the checker reports an undeclared module imported inside a function, a
    # distribution named otherwise than its module, and a submodule that needs another distribution.
    src = ("import json, torch\nfrom detent_rl import config\n"
           "def f():\n    import no_such_dist_xyz.sub\n    from torch.utils.tensorboard import SummaryWriter\n"
           "    import yaml\n    importlib.import_module('also_missing_abc')\n")
    missing = undeclared_imports({"x.py": src}, {"torch"}, {"detent_rl"})
    assert missing == ["x.py:4: no_such_dist_xyz.sub (needs no-such-dist-xyz)",
                       "x.py:5: torch.utils.tensorboard (needs tensorboard)",
                       "x.py:6: yaml (needs pyyaml)",
                       "x.py:7: also_missing_abc (needs also-missing-abc)"]
    assert undeclared_imports({"x.py": src}, {"torch", "tensorboard", "pyyaml", "no-such-dist-xyz",
                                              "also-missing-abc"}, {"detent_rl"}) == []

"""`bench/rev_ab.sh`: a command run in this tree and in older revisions' trees, back to back (the device's A/B and
bisection across commits, docs/BENCHMARKS.md). On a throwaway git repository whose package says which commit it is:
each run imports its own tree's package, `{tag}` names the run, and a missing tree or a bad call is refused."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"
PRINT = "import detent_rl, sys; print('tree', detent_rl.WHICH, sys.argv[1])"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    """Three commits of a package whose `WHICH` is the commit's name; the working tree says "head"."""
    if shutil.which("git") is None:
        pytest.skip("git not on PATH")
    r = tmp_path / "repo"
    (r / "bench").mkdir(parents=True)
    for f in ("rev_ab.sh", "link_package.sh"):
        shutil.copy(BENCH / f, r / "bench" / f)
    for d in ("selir", "kernels", "rollout", "trainer"):
        (r / d).mkdir()
        (r / d / "__init__.py").write_text("")
    (r / "detent_rl").mkdir()
    (r / "docs").mkdir()
    (r / "docs" / "big.md").write_text("not carried\n")
    _git(r, "init", "-q")
    revs = []
    for name in ("first", "second", "head"):
        (r / "detent_rl" / "__init__.py").write_text(f"WHICH = {name!r}\n")
        if name == "head":
            break
        _git(r, "add", "-A")
        _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", name)
        revs.append(_git(r, "rev-parse", "--short", "HEAD"))
    return r, revs


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/rev_ab.sh", *args], cwd=repo, capture_output=True, text=True, timeout=120)


def test_each_revision_runs_its_own_tree_after_this_ones(repo):
    r, (first, second) = repo
    prep = _run(r, "--prepare", f"{first},{second}")
    assert prep.returncode == 0, prep.stderr
    for rev in (first, second):
        assert (r / ".devrun" / f"rev-{rev}" / "detent_rl" / "__init__.py").is_file()
        assert not (r / ".devrun" / f"rev-{rev}" / "docs").exists()  # docs stay behind (the 64 MiB a call)
    done = _run(r, f"{first},{second}", "60", "--", "python3", "-c", PRINT, "{tag}")
    assert done.returncode == 0, done.stderr
    trees = [line for line in done.stdout.splitlines() if line.startswith("tree ")]
    assert trees == ["tree head main", f"tree first rev-{first}", f"tree second rev-{second}"]


def test_a_failing_run_is_named_and_the_others_still_run(repo):
    r, (first, _) = repo
    assert _run(r, "--prepare", first).returncode == 0
    done = _run(r, first, "60", "--", "python3", "-c",
                "import detent_rl, sys; print('tree', detent_rl.WHICH); sys.exit(detent_rl.WHICH == 'head')")
    assert done.returncode == 1
    assert "== rev_ab: main exited 1" in done.stdout and "tree first" in done.stdout


def test_bad_calls_are_refused_before_anything_runs(repo):
    r, (first, second) = repo
    missing = _run(r, f"{first},{second}", "60", "--", "python3", "-c", PRINT, "x")
    assert missing.returncode == 2 and f"no .devrun/rev-{first}" in missing.stderr and "tree" not in missing.stdout
    no_sep = _run(r, first, "60", "python3")
    assert no_sep.returncode == 2 and "expected --" in no_sep.stderr
    bad_rev = _run(r, "--prepare", "nosuchrev")
    assert bad_rev.returncode == 1 and "git archive nosuchrev failed" in bad_rev.stderr

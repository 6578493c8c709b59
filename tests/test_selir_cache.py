"""The JIT cache: hits skip solving; anything that can change the answer misses; damage is detected."""
from __future__ import annotations

import multiprocessing as mp
import warnings

import pytest

import detent_rl.selir.solver as solver_mod
from detent_rl.kernels.programs import attention as attn_mod
from detent_rl.selir.cache import JITCache, cache_key
from detent_rl.selir.solver import solve
from selir_helpers import HEADER, load_module

FACTS = attn_mod.REFERENCE_FACTS
PROGRAM = HEADER + '''
@selection
def prog(m: Unpinnable[int], cap: Fact[int]):
    assume(1 <= m <= cap)
    stride = knob("stride", {choices}, 0)
    row = TABLE[nearest_key(TABLE, m)]
    return {"a": row.a + stride, "b": row.b}
'''


def _no_solving(monkeypatch):
    monkeypatch.setattr(solver_mod, "analyze", lambda *a, **k: pytest.fail("a cache hit must not solve"))


def test_hit_skips_solving_and_gives_the_same_selector(tmp_path, monkeypatch):
    cache = JITCache(tmp_path)
    first = solve(attn_mod.attention_program, FACTS, cache=cache)
    _no_solving(monkeypatch)
    second = solve(attn_mod.attention_program, FACTS, cache=cache)
    assert second.from_cache and not first.from_cache and cache.hits == 1
    assert second.commit().source == first.commit().source
    assert second.legal == first.legal and second.stats == first.stats
    assert second.stock()(3, 1, 3, 700) == first.stock()(3, 1, 3, 700)


def test_any_change_misses(tmp_path):
    cache = JITCache(tmp_path / "c")
    a = load_module(PROGRAM.replace("{choices}", "(0, 1)"), tmp_path, "prog_a")
    b = load_module(PROGRAM.replace("{choices}", "(0, 2)"), tmp_path, "prog_b")  # another knob set
    c = load_module(PROGRAM.replace("{choices}", "(0, 1)").replace("row.b}", "row.b + 0}"), tmp_path, "prog_c")
    keys = {
        cache_key(a.prog, {"cap": 64}, level="full", cut="min", seed=0),
        cache_key(a.prog, {"cap": 65}, level="full", cut="min", seed=0),  # a fact
        cache_key(b.prog, {"cap": 64}, level="full", cut="min", seed=0),  # the knob set
        cache_key(c.prog, {"cap": 64}, level="full", cut="min", seed=0),  # the program text
        cache_key(a.prog, {"cap": 64}, level="fold", cut="min", seed=0),  # a solve option
    }
    assert len(keys) == 5
    solve(a.prog, {"cap": 64}, cache=cache)
    for prog, facts in ((a.prog, {"cap": 65}), (b.prog, {"cap": 64}), (c.prog, {"cap": 64})):
        assert not solve(prog, facts, cache=cache).from_cache
    assert solve(a.prog, {"cap": 64}, cache=cache).from_cache


def test_table_contents_are_part_of_the_key(tmp_path):
    a = load_module(PROGRAM.replace("{choices}", "(0, 1)"), tmp_path, "prog_t1")
    b = load_module(PROGRAM.replace("{choices}", "(0, 1)").replace("b=11", "b=12"), tmp_path, "prog_t2")
    assert a.prog.digest != b.prog.digest


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_detected_and_resolved(tmp_path, damage):
    cache = JITCache(tmp_path)
    good = solve(attn_mod.attention_program, FACTS, cache=cache)
    [path] = list(tmp_path.glob("*.selir"))
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        i = len(raw) - 100
        path.write_bytes(raw[:i] + bytes([raw[i] ^ 0x20]) + raw[i + 1:])
    elif damage == "garbage":
        import hashlib
        body = b'{"nodes": 3}'
        path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    else:
        path.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        again = solve(attn_mod.attention_program, FACTS, cache=cache)
    assert not again.from_cache and cache.corrupt == 1
    assert again.commit().source == good.commit().source
    assert solve(attn_mod.attention_program, FACTS, cache=cache).from_cache  # rewritten whole


def _writer(directory: str, rounds: int) -> None:
    cache = JITCache(directory)
    sol = solve(attn_mod.attention_program, FACTS, cache=JITCache(enabled=False))
    key = cache_key(attn_mod.attention_program, FACTS, level="full", cut="min", seed=0)
    for _ in range(rounds):
        cache.store(key, sol)


def test_concurrent_writers_never_leave_a_torn_file(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 15)) for _ in range(3)]
    for p in procs:
        p.start()
    reader = JITCache(tmp_path)
    key = cache_key(attn_mod.attention_program, FACTS, level="full", cut="min", seed=0)
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn read would warn "corrupt"
        while any(p.is_alive() for p in procs):
            if reader.load(key) is not None:
                seen += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert reader.corrupt == 0 and reader.load(key) is not None
    assert [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")] == []
    assert seen > 0, "the reader should have seen complete entries while the writers ran"


def test_directory_from_env_and_disable_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("DETENT_CACHE_DIR", str(tmp_path / "from-env"))
    solve(attn_mod.attention_program, FACTS)
    assert list((tmp_path / "from-env").glob("*.selir"))
    monkeypatch.setenv("DETENT_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setenv("DETENT_CACHE_DISABLE", "1")
    assert not solve(attn_mod.attention_program, FACTS).from_cache
    assert not solve(attn_mod.attention_program, FACTS).from_cache
    assert not (tmp_path / "off").exists()

"""Our kernel families' selection programs: the pins the issue promises, and invariance when committed."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from detent_rl.kernels.programs import allreduce, attention, matmul, moe
from detent_rl.selir.parse import parse_program
from detent_rl.selir.solver import analyze, solve

MODULES = (attention, matmul, moe, allreduce)


def _random_inputs(sol, rng: random.Random) -> tuple:
    out = []
    for name in sol.params:
        lo, hi, values = sol.domains.get(name, (None, None, (False, True)))
        out.append(rng.choice(values) if values is not None else rng.randint(int(lo), int(hi)))
    return tuple(out)


def _valid(call, args):
    from detent_rl.selir import SelectionError
    try:
        return call(*args)
    except SelectionError:
        return None


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.PROGRAM.name)
def test_committed_is_invariant_and_stock_is_not(mod):
    sol = solve(mod.PROGRAM, mod.REFERENCE_FACTS)
    assert sol.stats["pins"], "every family here has batch-dependent selection points"
    committed, stock = sol.commit(), sol.stock()
    rng = random.Random(0)
    got, seen_stock = set(), set()
    for _ in range(3000):
        args = _random_inputs(sol, rng)
        c, s = _valid(committed, args), _valid(stock, args)
        if c is not None:  # what decides bits; a declared schedule (matmul's tile) may follow the batch
            got.add(tuple(committed.bits(c).items()))
        if s is not None:
            seen_stock.add(tuple(stock.bits(s).items()))
    assert len(got) == 1, f"committed {mod.PROGRAM.name} changed with the batch: {got}"
    assert len(seen_stock) > 1, f"negative control: stock {mod.PROGRAM.name} never changed"


def test_moe_cut_is_the_row_key():
    spec, g, pins, _ = analyze(moe.fused_moe_program, moe.REFERENCE_FACTS)
    assert list(pins) == ["row_key"]
    assert pins["row_key"].op == "nearest"
    governed = [p for p, n in g.point_nodes(batch_only=True).items()]
    assert len(governed) >= 6  # every config field, blocked by one pin
    _, _, none_pins, _ = analyze(moe.fused_moe_program, moe.REFERENCE_FACTS, cut="none")
    assert len(none_pins) == len(governed)


def test_matmul_cut_is_the_k_partition_and_the_schedule_follows_m():
    sol = solve(matmul.matmul_program, matmul.REFERENCE_FACTS)
    assert sol.stats["pins"] == ("chunk",)
    assert set(sol.stats["schedule_points"]) == {f"tile.{f}" for f in ("parallel", "block_m", "block_n", "block_k",
                                                                        "group_m", "num_warps", "num_stages", "wgmma",
                                                                        "swap_ab", "persistent")}
    stock, pinned = sol.stock(), sol.commit({"chunk": 640})
    assert stock(1).chunk == 640 and stock(8192).chunk == 4864  # split-K for decode, K whole for prefill
    assert pinned(1).chunk == pinned(8192).chunk == 640
    assert pinned(1).tile_parallel and not pinned(8192).tile_parallel  # the same chunks, in parallel or in turn
    assert pinned(1).tile_block_m < pinned(8192).tile_block_m
    # the same program without the schedule declaration: the tile is a selection point like any other,
    # so the cut must also block M's way into it, and a pinned selector runs one tile for every M
    undeclared = parse_program(matmul.matmul_program.fn, name="matmul_undeclared")
    bare = solve(undeclared, matmul.REFERENCE_FACTS)
    pins = bare.stats["pins"]
    assert len(pins) == 2 and "chunk" in pins and any(p.startswith("bucket") for p in pins)  # the tile row's key
    one = bare.commit()
    assert one(1) == one(8192)


def test_constant_folding_alone_needs_more_pins_on_attention():
    _, g_full, full, _ = analyze(attention.attention_program, attention.REFERENCE_FACTS, level="full")
    _, g_fold, fold, _ = analyze(attention.attention_program, attention.REFERENCE_FACTS, level="fold")
    assert len(fold) > len(full)
    assert len(g_fold.nodes) > len(g_full.nodes)
    # what range analysis proves: no int64 indexing below 2^31 elements, batch within the PDL limit
    assert {"int64_index", "varlen_pdl"} <= set(fold) and not {"int64_index", "varlen_pdl"} & set(full)


def test_attention_stride_knob_makes_split_boundaries_fixed():
    sol = solve(attention.attention_program, attention.REFERENCE_FACTS)
    stock = sol.stock({"split_stride": 1024})
    sizes = {stock(b, 1, b, k).split_size for b in (1, 8, 64, 256) for k in (100, 1000, 4000)}
    assert sizes == {1024}
    fa3 = sol.stock({"split_stride": 0})
    assert len({fa3(b, 1, b, 4000).split_size for b in (1, 8, 64, 256)}) > 1


def test_allreduce_legality_follows_the_workspace():
    sol = solve(allreduce.allreduce_program, allreduce.REFERENCE_FACTS)
    legal = [dict(zip(sol.axes, a)) for a in sol.legal]
    assert all(not a["use_graph_buffers"] for a in legal), "graph buffers cannot serve eager calls"
    assert not any(a["algorithm"] == "one_shot_push" for a in legal), "messages outgrow the push slot"
    assert any(a["algorithm"] == "two_shot_pull" for a in legal)


def test_report_command_and_dot(tmp_path):
    out = subprocess.run([sys.executable, "-m", "detent_rl.solve", "--report", "--program", "fused_moe",
                          "--program", "attention"], capture_output=True, text=True, check=True).stdout
    assert "== fused_moe on reference ==" in out and "pins, full analysis         1: row_key" in out
    assert "pins, constant folding only 5" in out and "pins, full analysis         3" in out
    assert "legal" in out and "candidates" in out
    dot = tmp_path / "moe.dot"
    subprocess.run([sys.executable, "-m", "detent_rl.solve", "--program", "fused_moe", "--dot", str(dot)],
                   check=True, capture_output=True)
    text = dot.read_text()
    assert text.startswith('digraph "fused_moe on reference"') and "[PIN]" in text and "row_key" in text
    assert "#984ea3" in text  # the Unpinnable input is tinted

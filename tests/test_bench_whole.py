"""Whole-step graphs (rollout/full_steps.py) in the rollout bench and the recipe: `--step-graphs whole` runs every
arm's prefill and mixed steps through them, `on,whole` runs each arm through the pieces and through them in one run,
each against its own kind of stock run; `rollout.step_graphs: whole` gives the run's engine `full_steps`."""
from __future__ import annotations

import json

import pytest

from detent_rl.bench import main

QUICK = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--quick", "--cases", "poisson,grpo",
         "--arms", "stock,detent", "--stock-pdl", "on"]


def test_whole_steps_run_in_every_arm(tmp_path):
    assert main(QUICK + ["--step-graphs", "whole", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["step_graphs"] == "whole" and data["arms"] == ["stock", "detent"]
    for c in ("poisson", "grpo"):
        for arm in ("stock", "detent"):
            r = data["cases"][c][arm]
            assert r["whole_steps"] > 0 and r["whole_steps"] == r["piece_steps"], (c, arm, r)
    assert "through whole-step graphs (attention inside), every arm" in (tmp_path / "bench.md").read_text()


def test_pieces_and_whole_steps_in_one_run_pair_each_arm_with_its_own_kind_of_stock(tmp_path):
    assert main(QUICK + ["--step-graphs", "on,whole", "--rounds", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    arms = ["stock", "stock + whole", "detent", "detent + whole"]
    assert data["step_graphs"] == "pieces,whole" and data["arms"] == arms
    for r in data["rounds"]:  # the plain runs through the pieces only, the '+ whole' runs through whole graphs
        for c in ("poisson", "grpo"):
            assert all(r[c][a]["piece_steps"] > 0 for a in arms)
            assert all((r[c][a].get("whole_steps", 0) > 0) == a.endswith("whole") for a in arms), (c, r[c])
    grpo = [{a: r["grpo"][a]["tok_per_s"] for a in arms} for r in data["rounds"]]
    ratios = data["round_ratios"]["grpo"]
    assert ratios["stock + whole"] == [1.0, 1.0]  # over its own kind of stock run
    assert ratios["detent + whole"] == pytest.approx([g["stock + whole"] / g["detent + whole"] for g in grpo])
    table = (tmp_path / "bench.md").read_text()
    assert "each arm also through whole-step graphs ('+ whole'" in table and "| stock + whole (PDL on) |" in table
    effect = sorted(g["detent"] / g["detent + whole"] for g in grpo)
    assert "Time through whole-step graphs over without" in table
    assert f"| grpo | detent | {sum(effect) / 2:.2f}x (" in table


def test_no_step_graphs_and_whole_steps_in_one_run(tmp_path):
    """`off,whole`: each arm without step graphs and through whole-step graphs in one process (the default's cost
    or gain on a case, its decode steps included), each against its own kind of stock run."""
    assert main(QUICK[:-6] + ["--cases", "decode-1,grpo", "--arms", "stock,detent", "--stock-pdl", "on",
                              "--step-graphs", "off,whole", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    arms = ["stock", "stock + whole", "detent", "detent + whole"]
    assert data["step_graphs"] == "off,whole" and data["arms"] == arms
    grpo = data["cases"]["grpo"]
    assert all(grpo[a].get("piece_steps", 0) == 0 and grpo[a].get("whole_steps", 0) == 0 for a in arms[::2]), grpo
    assert all(grpo[a]["whole_steps"] > 0 for a in arms[1::2]), grpo
    assert all(data["cases"]["decode-1"][a]["ms_per_step"] > 0 for a in arms)
    table = (tmp_path / "bench.md").read_text()
    assert "without step graphs, each arm also through whole-step graphs ('+ whole'" in table
    assert "| decode-1 | detent + whole |" in table and "Time through whole-step graphs over without" in table


def test_the_recipe_switch_whole_gives_the_engine_whole_step_graphs(tmp_path):
    from detent_rl.config import parse_recipe
    from detent_rl.recipe_schema import RecipeError
    base = {"run": {"name": "t"}, "model": {"builtin": "tiny"}, "data": {"source": "reasoning_gym:basic_arithmetic"}}
    whole = parse_recipe({**base, "rollout": {"step_graphs": "whole"}}).rollout
    assert whole.whole("cpu") and whole.whole("cuda") and whole.pieces("cpu") and whole.pieces("cuda")
    on = parse_recipe({**base, "rollout": {"step_graphs": "on"}}).rollout
    assert on.pieces("cpu") and on.pieces("cuda") and not on.whole("cpu") and not on.whole("cuda")
    with pytest.raises(RecipeError, match=r"rollout\.step_graphs: expected one of 'auto', 'on', 'off', 'whole', "
                                          r"got 'full'"):
        parse_recipe({**base, "rollout": {"step_graphs": "full"}})

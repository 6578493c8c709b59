"""The batch-invariance battery: with the detent and det selections every cell passes, with stock
some fail (the negative control that shows the battery can fail); the prefix cells really hit the
cache; the CLI's table, JSON, verdict (exit 0 exactly when pinned arms pass and stock fails) and errors."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch

from detent_rl import battery as B
from detent_rl.models import load_model
from detent_rl.models.builtin import BUILTINS, write_checkpoint
from detent_rl.models.config import ModelConfig

# One layer of the default built-in model, narrower, its weights made the same way: every cell of
# an arm in about a minute.
MICRO = dict(BUILTINS["tiny-qwen2"].config, vocab_size=1024, hidden_size=128, intermediate_size=256,
             num_hidden_layers=1)
CELLS = B.build_cells(ModelConfig.from_dict(MICRO).vocab_size, B.PAGE_SIZE)


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """`micro(arm)`: the micro model's checkpoint loaded for `arm`, as the battery loads built-ins."""
    path = write_checkpoint(tmp_path_factory.mktemp("micro") / "ckpt", MICRO, BUILTINS["tiny-qwen2"].init)
    return lambda arm: load_model(path, arm, "cpu", torch.float32, page_size=B.PAGE_SIZE)


@pytest.fixture(autouse=True)
def _models_dir(tmp_path_factory, monkeypatch):
    """The CLI's built-in checkpoints go to one directory of this module, not the user's cache."""
    monkeypatch.setenv("DETENT_MODELS_DIR", str(tmp_path_factory.getbasetemp() / "battery-models"))


def _failures(results: list[B.CellResult]) -> dict[str, list[str]]:
    return {r.cell: [f"{c.mode} {c.status}: {c.detail}" for c in r.comparisons if not c.passed]
            for r in results if not r.passed}


def test_cells_are_the_papers_26_plus_9_strong_plus_rescore():
    assert Counter(c.group for c in CELLS) == {"rerun": 2, "cobatch": 14, "row": 4, "prefix": 6, "strong": 9,
                                               "rescore": 1}
    assert len({c.name for c in CELLS}) == len(CELLS)
    assert B.select_cells(CELLS, "prefix,rerun-*") == [c for c in CELLS if c.group == "prefix" or
                                                       c.name.startswith("rerun-")]
    with pytest.raises(B.BatteryError, match=r"--cells \['nope'\] match no cell"):
        B.select_cells(CELLS, "rescore,nope")


@pytest.mark.parametrize("arm", ["detent", "det"])
def test_pinned_arms_pass_every_cell(arm, micro):
    battery = B.Battery(micro(arm))
    results = [battery.run_cell(c) for c in CELLS]
    assert [r.cell for r in results] == [c.name for c in CELLS] and all(len(r.comparisons) == 2 for r in results)
    assert _failures(results) == {}
    # the prefix cells hit 1..6 blocks (the run raises otherwise; checked here once more)
    for cell in CELLS:
        if cell.group == "prefix":
            assert battery.outcome(cell.changed, "T=0").cached == cell.changed.expect_cached > 0
    tokens = battery.reference_tokens()
    assert len(set(tokens)) >= 8, f"degenerate random model: the target decodes {tokens}"


def test_stock_arm_fails_cells_negative_control(micro):
    cells = B.select_cells(CELLS, "rerun-alone,cobatch-31-short,cobatch-chunked,strong-32-mixed,rescore")
    results = {r.cell: r for r in B.run_battery(micro("stock"), cells)}
    assert results["rerun-alone"].passed, "a rerun of the same batch is reproducible even for stock"
    failed = [name for name, r in results.items() if not r.passed]
    assert len(failed) >= 3, f"negative control: stock selection must change the target's bits, failed {failed}"
    assert all(c.first_diff is not None and not c.error for name in failed for c in results[name].comparisons)


def test_a_crashing_run_fails_its_cell_and_the_battery_goes_on(micro):
    cell = B.Cell("broken", "cobatch", "a run the engine refuses", B.Run(), B.Run(max_num_tokens=10**9))
    results = B.run_battery(micro("detent"), [cell, CELLS[0]])
    assert [c.status for c in results[0].comparisons] == ["ERROR", "ERROR"]
    assert "max_num_tokens" in results[0].comparisons[0].detail and results[1].passed


def test_compare_names_the_first_differing_position_with_both_bits():
    ref = B.Outcome(tuple(range(16)), tuple(-1.0 - i for i in range(16)), 0)
    assert B.compare(ref, ref, "T=0").passed
    nudged = B.Outcome(ref.tokens, ref.logprobs[:5] + (float(torch.tensor(-6.0).nextafter(torch.tensor(0.0))),)
                       + ref.logprobs[6:], 0)
    c = B.compare(ref, nudged, "T=1")
    assert (c.first_diff, c.passed) == (5, False) and "0xc0c00000" in c.detail and "0xc0bfffff" in c.detail
    other = B.Outcome(ref.tokens[:3] + (99,) + ref.tokens[4:], ref.logprobs, 0)
    assert B.compare(ref, other, "T=0").first_diff == 3


# ---------------------------------------------------------------------------------------------
# CLI

def test_cli_passes_with_detent_and_writes_json(tmp_path, capsys):
    out = tmp_path / "battery.json"
    assert B.main(["--cells", "rerun-alone,prefix-2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first difference" in text and "rerun-alone" in text and "detent: 2/2 cells pass, 0 fail" in text
    data = json.loads(out.read_text())
    assert [r["cell"] for r in data["results"]] == ["rerun-alone", "prefix-2"] and data["dtype"] == "fp32"
    assert all(r["passed"] for r in data["results"])
    assert data["verdict"] == {"ok": True, "why": "verdict: OK: detent passes all 2 cells"}


def test_cli_all_arms_exit_0_when_pinned_arms_pass_and_stock_fails(capsys):
    assert B.main(["--arm", "all", "--cells", "cobatch-budget"]) == 0
    text = capsys.readouterr().out
    assert "stock: 0/1 cells pass, 1 fail" in text and "det: 1/1 cells pass" in text and "FAIL@" in text
    assert text.rstrip().splitlines()[-1] == ("verdict: OK: stock fails 1 of 1 cells, as the negative control "
                                              "must; det passes all 1 cells; detent passes all 1 cells")


def test_cli_stock_alone_exits_0_only_when_it_fails_a_cell(capsys):
    assert B.main(["--arm", "stock", "--cells", "cobatch-budget"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("verdict: OK: stock fails 1 of 1 cells, as the negative "
                                                     "control must")
    # a rerun of the same batch is reproducible even for stock: these cells cannot expose it
    assert B.main(["--arm", "stock", "--cells", "rerun-alone"]) == 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("verdict: FAIL: stock (the negative control) passes all 1 cells")


def test_cli_corun_passes_rollout_cells_and_is_not_held_to_rescore(capsys):
    # CoRun's fixed shapes: batch composition and the target's row leave its bits alone (two slots
    # instead of the default change nothing: decode pads to the deployment's concurrency), prefix cells
    # do not apply (no prefix cache), and the trainer's one-shot prefill is not promised
    assert B.main(["--arm", "corun", "--cells", "cobatch-late-join,row-3,prefix-2,rescore"]) == 0
    text = capsys.readouterr().out
    assert "prefix-2" not in text.split("verdict")[0].split("first difference")[1]
    assert text.rstrip().endswith("verdict: OK: corun passes all 2 rollout cells; its rollout and the trainer's "
                                  "prefill differ (rescore), as CoRun's do")
    assert B.parse_arms("all") == ["stock", "det", "detent"] and B.parse_arms("corun,stock") == ["corun", "stock"]


def test_cli_exit_status_is_nonzero_when_a_pinned_arm_fails(capsys, monkeypatch):
    def differs(ref, got, mode):
        return B.Comparison(mode, 3, "token 1 vs 2")

    monkeypatch.setattr(B, "compare", differs)  # as if detent's bits changed with the batch
    assert B.main(["--arm", "detent", "--cells", "rerun-alone,prefix-2"]) == 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last == "verdict: FAIL: detent: 2 of 2 cells change the target's bits (rerun-alone, prefix-2)"


def _result(arm: str, cell: str, *statuses: str) -> B.CellResult:
    comparisons = [B.Comparison(mode, None if s == "pass" else 0, s, error=s == "error")
                   for mode, s in zip(B.MODES, statuses)]
    return B.CellResult(cell, "cobatch", arm, comparisons)


@pytest.mark.parametrize("results,ok,words", [
    ([_result("detent", "a", "pass", "pass"), _result("stock", "a", "pass", "diff")], True,
     ["stock fails 1 of 1 cells, as the negative control must", "detent passes all 1 cells"]),
    ([_result("detent", "a", "pass", "diff"), _result("stock", "a", "diff", "diff")], False,
     ["detent: 1 of 1 cells change the target's bits (a)", "stock fails 1 of 1"]),
    ([_result("det", "a", "pass", "pass"), _result("stock", "a", "pass", "pass"),
      _result("stock", "b", "pass", "pass")], False, ["stock (the negative control) passes all 2 cells"]),
    ([_result("stock", "a", "error", "error")], False, ["stock: 1 of 1 cells raised (a)"]),
    ([_result("detent", f"c{i}", "pass", "error") for i in range(6)], False,
     ["detent: 6 of 6 cells raised (c0, c1, c2, c3, ... (2 more))"]),
    ([], False, ["no cell was run"]),
])
def test_verdict(results, ok, words):
    got, why = B.verdict(results)
    assert got == ok and all(w in why for w in words), why
    assert why.startswith("verdict: OK: " if ok else "verdict: FAIL: ")


@pytest.mark.parametrize("argv,message", [
    (["--arm", "fast"], "unknown arm(s) ['fast']; expected one of stock, det, detent"),
    (["--model", "no/such/ckpt"], "no/such/ckpt does not exist"),
    (["--cells", "strong-64-*"], "--cells ['strong-64-*'] match no cell"),
    (["--step-tokens", "100000"], "step budget 100000 is outside 1..8192 (the deployment's max_num_tokens)"),
])
def test_cli_errors_name_what_is_wrong(argv, message, capsys):
    assert B.main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_missing_checkpoint_config_is_named(tmp_path, capsys):
    assert B.main(["--model", str(tmp_path)]) == 2
    assert f"{tmp_path}/config.json: no such config file" in capsys.readouterr().err


def test_module_entry_point_lists_cells():
    done = subprocess.run([sys.executable, "-m", "detent_rl.battery", "--list"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 36 and done.stdout.startswith("rerun-alone")


# ---------------------------------------------------------------------------------------------
# GPU: the built-in configs in bf16 on the Triton paths, and SmolLM2's real weights when converted

@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tiny-qwen2", "qwen2-0.5b", "qwen3-0.6b", B.SMOLLM2])
def test_gpu_battery_bf16(model):
    if model == B.SMOLLM2:
        from detent_rl.models.gguf import ModelFetchError
        try:
            B.checkpoint_dir(model)
        except ModelFetchError as e:
            pytest.skip(f"SmolLM2 is not converted here and cannot be fetched: {e}")
    cells = B.build_cells(B.model_config(model).vocab_size, B.PAGE_SIZE)
    for arm in ("detent", "det"):
        results = B.run_battery(B.open_model(model, arm, "cuda", torch.bfloat16), cells)
        assert _failures(results) == {}, arm
    stock = B.run_battery(B.open_model(model, "stock", "cuda", torch.bfloat16), cells)
    assert _failures(stock), "negative control: stock selection must change the target's bits"


def test_cli_over_two_tensor_parallel_ranks(tmp_path):
    """`--tp 2`: every rank runs the cells in step (gloo), rank 0 reports; detent passes, stock fails.
    (Run in a subprocess: the ranks are spawned processes.)"""
    import subprocess
    import sys
    out = tmp_path / "tp.json"
    run = subprocess.run([sys.executable, "-m", "detent_rl.battery", "--tp", "2", "--arm", "stock,detent",
                          "--cells", "cobatch-budget,rescore", "--json", str(out)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "over 2 tensor-parallel ranks" in run.stdout and run.stdout.count("verdict: OK") == 1
    data = json.loads(out.read_text())
    assert data["tp"] == 2
    passed = {(r["arm"], r["cell"]): r["passed"] for r in data["results"]}
    assert passed[("detent", "cobatch-budget")] and passed[("detent", "rescore")]
    assert not passed[("stock", "cobatch-budget")]

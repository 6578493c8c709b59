"""The tuner: a workload profiled, every measured site given a legal assignment from timing (small
grids whole, large ones by coordinate descent within a tenth of the grid), the prediction checked
by running the workload again; the tuple loads in engine and trainer alike, and the tuned engine
keeps its invariance (rollout == rescore, alone == batched)."""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from detent_rl.kernels.commitment import CommitmentError, CommitmentTuple, SiteCommitment
from detent_rl.models import load_model
from detent_rl.models.layers import Linear
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.tune import MAX_CALLS, Workload, _thinned, main, tune
from detent_rl.tune_search import BUDGET, LADDER, candidates, search
from test_models import LIMITS, hf_model, save, sequences


def test_tuned_tuple_is_legal_loadable_and_keeps_invariance(tmp_path):
    path = save(hf_model("qwen2"), tmp_path / "m")
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    before = model.selections.resolved()
    lines = []
    build = lambda t: load_model(path, "detent", dtype=torch.float32, commitment=t, **LIMITS)  # noqa: E731
    tuned, report = tune(model, Workload(prompts=3, prompt_len=20, new_tokens=5, micro_batch=2), build=build,
                         repeats=1, log=lines.append)
    matmul_sites = {k for k in tuned.sites if k.startswith("matmul")}
    measured = {r.key for r in report.sites}
    assert matmul_sites <= measured | {k for k in matmul_sites if len(model.selections.solution(
        "matmul", **model.selections.sites()[k][1]).legal) <= 1}
    assert len(lines) == len(report.sites)
    assert all(r.measured == r.grid for r in report.sites if r.grid <= 8)  # small grids: measured whole
    assert all(r.calls > 0 for r in report.sites)
    assert report.measured_s is not None and report.additivity_error is not None
    assert report.default_s > 0 and report.rounds == 1  # the model's tuple, timed beside the tuned one
    gains = sum(s.default_s - s.best_s for s in report.sites)
    assert report.predicted_s == pytest.approx(report.default_s - gains, rel=1e-12, abs=0)
    assert f"saving measured {report.default_s - report.measured_s:.3f} s, predicted {gains:.3f} s" in report.render()
    assert report.untuned == [] and "attention" in measured  # attention's grid searched too
    attention = next(r for r in report.sites if r.key == "attention")
    assert attention.grid > 8 and attention.measured <= max(8, BUDGET * attention.grid)
    for n, k in {tuple(m.weight.shape) for m in model.modules() if isinstance(m, Linear)}:
        sol = model.selections.solution("matmul", n=n, k=k)  # a legal partition (none where K is one chunk)
        assert tuned.sites[f"matmul[k={k}][n={n}]"].pins.get("chunk") in sol.candidates.get("chunk", (None,))
    # a new tuple: every site of the model, the others at the model's values; the model is untouched
    assert set(tuned.sites) == set(before.sites) and tuned.deployment == before.deployment
    assert all(tuned.sites[k] == before.sites[k] for k in set(before.sites) - measured)
    assert model.selections.commitment is None and model.selections.resolved() == before
    tuned.save(tmp_path / "t.json")
    again = load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(tmp_path / "t.json"),
                       **LIMITS)
    prompts = sequences(3, (5, 20, 37))
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=5) for i in range(3)]
    batched = Engine(again, num_blocks=32).generate(prompts, params)
    for p, sp, b in zip(prompts, params, batched):
        alone = Engine(again, num_blocks=32).generate([p], [sp])[0]
        assert (alone.completion, alone.logprobs) == (b.completion, b.logprobs)
        assert Engine(again, num_blocks=32).rescore(b) == b.logprobs


def test_exhaustive_check_measures_every_distinct_candidate_beside_the_search(tmp_path, monkeypatch):
    """`--exhaustive N`: a site of at most N distinct candidates is also measured whole, and the
    search's best is set against the exhaustive best; larger sites are left to the search alone."""
    import detent_rl.tune as tune_module
    path = save(hf_model("qwen2"), tmp_path / "m")
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    distinct = {}
    real = tune_module.candidates

    def recorded(family, sol, default, calls, facts):
        out = real(family, sol, default, calls, facts)
        distinct[len(distinct)] = out
        return out
    monkeypatch.setattr(tune_module, "candidates", recorded)
    workload = Workload(prompts=2, prompt_len=12, new_tokens=3, micro_batch=2)
    _, report = tune(model, workload, repeats=1, families=("attention", "matmul"), exhaustive=15, log=lambda _: None)
    sizes = [len(distinct[i]) for i in range(len(report.sites))]
    assert any(n <= 15 for n in sizes) and any(n > 15 for n in sizes), sizes  # both kinds of site
    for site, cands in zip(report.sites, (distinct[i] for i in range(len(report.sites)))):
        if len(cands) <= 15:
            assert site.exhaustive in cands and site.exhaustive_n == len(cands)
            assert site.best in cands and site.found in cands and math.isfinite(site.gap)
        else:
            assert site.exhaustive is None and site.gap is None
    assert "search over exhaustive" in report.render()
    _, plain = tune(model, workload, repeats=1, families=("attention",), log=lambda _: None)
    assert all(s.exhaustive is None for s in plain.sites) and "search over exhaustive" not in plain.render()
    # no build, no check: the prediction falls back to the profiled run
    assert plain.default_s is None and plain.measured_s is None and plain.additivity_error is None
    gains = sum(s.default_s - s.best_s for s in plain.sites)
    assert plain.predicted_s == pytest.approx(plain.profiled_s - gains, rel=1e-12, abs=0)
    assert "not measured" in plain.render() and "saving measured" not in plain.render()


def test_check_times_both_engines_alternately_and_predicts_from_the_default(tmp_path, monkeypatch):
    """The check runs the workload on the profiled engine and the tuned one in turn, `repeats` rounds
    (which goes first alternating), and predicts from the default's median beside the tuned one, not from the
    profiled (recorded) run.
    The runs are real; the seconds they report are scripted, so medians, order and fallback are exact."""
    path = save(hf_model("qwen2"), tmp_path / "m")
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    # warm-up, profile, tuned warm-up, then 3 rounds, which one goes first alternating: (default, tuned),
    # (tuned, default), (default, tuned); medians 2.2 and 1.7, neither the last round's (2.9, 1.5) nor
    # the mean (2.37, 1.9)
    # (generate, rescore) each run; the totals as above
    scripted = iter([(8.0, 1.0), (4.0, 1.0), (8.0, 1.0), (1.5, 0.5), (1.25, 0.5), (2.0, 0.5), (1.625, 0.625),
                     (2.25, 0.625), (1.0, 0.5)])
    engines = []
    real = Workload.run_phases

    def run_phases(self, engine):
        real(self, engine)
        engines.append(engine)
        return next(scripted)
    monkeypatch.setattr(Workload, "run_phases", run_phases)
    build = lambda t: load_model(path, "detent", dtype=torch.float32, commitment=t, **LIMITS)  # noqa: E731
    _, report = tune(model, Workload(prompts=2, prompt_len=12, new_tokens=3, micro_batch=2), build=build, repeats=3,
                     families=("log_softmax",), log=lambda _: None)
    default, tuned = engines[0], engines[2]
    assert default is not tuned
    assert engines == [default, default, tuned] + [default, tuned, tuned, default, default, tuned]
    assert (report.profiled_s, report.default_s, report.measured_s, report.rounds) == (5.0, 2.25, 1.75, 3)
    assert report.default_phases == (1.625, 0.625) and report.measured_phases == (1.25, 0.5)
    assert report.round_savings == [0.25, -0.25, 1.375]  # each round's pair: (2, 1.75), (2.25, 2.5), (2.875, 1.5)
    assert report.sites and report.measured_saving_s == 0.5
    gains = sum(s.default_s - s.best_s for s in report.sites)
    assert report.predicted_saving_s == gains and report.predicted_s == pytest.approx(2.25 - gains, rel=1e-12, abs=0)
    assert report.additivity_error == pytest.approx(abs(1.75 - (2.25 - gains)) / 1.75)
    text = report.render()
    assert "profiled run (model's tuple, selector calls recorded, once): 5.000 s" in text
    assert (f"medians of 3 alternating rounds: 2.250 -> 1.750 s (generate 1.625 -> 1.250 s, rescore 0.625 -> "
            f"0.500 s); saving measured 0.500 s, predicted {gains:.3f} s" in text)
    assert "each round's saving: -0.250 to 1.375 s, the tuned tuple faster in 2 of 3 rounds" in text
    # the verdict: a spread that holds both 0 and the predicted saving cannot tell them apart; one that does not can
    lo, hi = min(0.0, gains) - 0.25, max(0.0, gains) + 0.25
    report.round_savings = [lo, (lo + hi) / 2, hi]
    assert "cannot tell them apart in 3 rounds" in report.round_verdict()
    report.round_savings = [hi + 0.5, hi + 0.75, hi + 1.0]
    assert "cannot tell" not in report.round_verdict()
    assert "faster in 3 of 3 rounds" in report.round_verdict()


def test_search_measures_a_tenth_of_a_large_grid_and_reaches_the_separable_optimum():
    axes = ("a", "b", "c")
    legal = [(a, b, c) for a in range(8) for b in range(6) for c in range(5) if (a + b) % 7 != 3]  # holes
    target = (5, 2, 4)
    cost = lambda x: sum((v - t) ** 2 for v, t in zip(x, target)) + 1.0  # noqa: E731
    calls = []
    best, measured = search(axes, legal, (0, 0, 0), lambda x: calls.append(x) or cost(x))
    assert best == target and len(measured) == len(calls) <= BUDGET * len(legal)
    assert set(measured) <= set(legal)  # only legal candidates are measured
    # a small grid is measured whole; the exhaustive best
    small = legal[:6]
    best, measured = search(axes, small, small[0], cost)
    assert len(measured) == 6 and best == min(small, key=cost)


def test_a_long_numeric_axis_is_bracketed_and_coupled_values_move_together():
    """The attention split's shape of grid: ~100 sizes, each with its one covering count (coupled: no
    single-axis move stays legal). The bracket finds the optimum in a few rounds of LADDER samples."""
    sizes = sorted({64 * k for k in range(2, 190)} & {64 * round(128 * 1.04 ** e / 64) for e in range(120)})
    legal = [(f, -(-12080 // s), s) for f in (False, True) for s in sizes]
    cost = lambda a: (math.log(a[2]) - math.log(512)) ** 2 + 0.1 * a[0] + 1.0  # noqa: E731
    best, measured = search(("is_decode", "num_splits", "split_size"), legal, (False, 12, 1024), cost, budget=10_000)
    assert best == (False, 24, 512) and best == min(legal, key=cost)
    assert len(measured) <= 6 * LADDER, len(measured)
    # clustered values (most samples in log space land on one end) still narrow to the optimum
    vals = [1] + list(range(1000, 1040))
    best, measured = search(("x",), [(v,) for v in vals], (1,), lambda a: abs(a[0] - 1017) + 1.0, budget=10_000)
    assert best == (1017,) and len(measured) < len(vals)


def test_attention_candidates_are_one_per_distinct_launch():
    """The long-context deployment's attention grid (115,050 legal assignments: split size x count x
    stride x decode tiles) comes down to one candidate per distinct launch over the recorded calls,
    each with the fewest splits covering the context; an assignment with a surplus split is legal but
    not measured."""
    from detent_rl.kernels.programs.attention import REFERENCE_FACTS, attention_program
    from detent_rl.selir.solver import solve
    facts = {**REFERENCE_FACTS, "max_context": 12080, "max_num_tokens": 16384, "page_size": 16}
    sol = solve(attention_program, facts)
    calls = Counter({(2, 1, 2, k): 1 for k in range(12001, 12065)})  # decode steps, then the prefills
    calls.update({(1, 12000, 12000, 12000): 2, (1, 12064, 12064, 12064): 2})
    default = sol.assignment({"block_n": 64, "num_splits": 12, "split_size": 1024}, {"split_stride": 0})
    kept = candidates("attention", sol, default, calls, facts)
    legal = set(sol.legal)
    assert len(legal) > 100_000 and 50 < len(kept) < 300 and kept[0] == default and set(kept) <= legal
    count, size = sol.axes.index("num_splits"), sol.axes.index("split_size")
    assert all(a[count] == -(-12080 // a[size]) for a in kept)
    launches = [tuple(repr(sol.commit(*sol.split(a))(*x)) for x in sorted(calls)) for a in kept]
    assert len(set(launches)) == len(kept)
    surplus = default[:count] + (13,) + default[count + 1:]
    assert surplus in legal and surplus not in kept


def test_many_distinct_calls_are_replayed_through_a_few_with_their_weight():
    decode = Counter({(8, 1, 8, k): 1 for k in range(40, 240)})  # one call per KV length
    decode[(8, 1, 8, 100)] += 5
    thinned = _thinned(decode)
    assert len(thinned) == MAX_CALLS and sum(w for _, w in thinned) == sum(decode.values())
    assert all(args in decode for args, _ in thinned) and thinned == sorted(thinned)
    few = Counter({(1,): 3, (64,): 1})
    assert _thinned(few) == [((1,), 3.0), ((64,), 1.0)]


def test_cli_and_its_errors(tmp_path, capsys):
    path = save(hf_model("qwen2"), tmp_path / "m")
    out = tmp_path / "t.json"
    shape = ["--prompts", "2", "--prompt-len", "12", "--new-tokens", "3", "--repeats", "1"]
    assert main(["--model", str(path), "--dtype", "float32", *shape, "--no-check", "--max-context", "4096",
                 "--out", str(out)]) == 0
    assert any(k.startswith("matmul") for k in json.loads(out.read_text())["sites"])
    text = capsys.readouterr().out
    assert f"sha256 {CommitmentTuple.load(out).sha256()}" in text and "| site | grid | measured |" in text
    # tuned for the default limits: a run with other limits refuses it; tuned with the run's, it loads
    with pytest.raises(CommitmentError, match="deployment: max_context: tuple 4096, model 256; max_batch: tuple 256, "
                                              "model 16; max_num_tokens: tuple 8192, model 512 "):
        load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(out), **LIMITS)
    assert main(["--model", str(path), "--dtype", "float32", *shape, "--out", str(out),
                 *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items())]) == 0
    assert "additivity error" in capsys.readouterr().out
    load_model(path, "detent", dtype=torch.float32, commitment=CommitmentTuple.load(out), **LIMITS)
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--prompts", "0", "--out", str(out)])
    assert "workload prompts must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "none"), "--out", str(out)])
    assert f"--model: '{tmp_path / 'none'}' is neither a built-in model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--repeats", "0", "--out", str(out)])
    assert "--repeats 0: at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="repeats is 0"):
        tune(load_model(path, "detent", dtype=torch.float32, **LIMITS), Workload(1, 4, 1), repeats=0)
    with pytest.raises(SystemExit):
        main(["--recipe", "r.yaml", "--max-batch", "8", "--out", str(out)])
    assert "--recipe sets the deployment limits; max_batch cannot be given with it" in capsys.readouterr().err
    stock = load_model(path, "stock", dtype=torch.float32, **LIMITS)
    with pytest.raises(ValueError, match="detent arm"):
        tune(stock, Workload(1, 4, 1))
    with pytest.raises(ValueError, match="exceed the deployment's context of 256"):
        tune(load_model(path, "detent", dtype=torch.float32, **LIMITS), Workload(1, 250, 10))
    # a sequence past a trainer forward's tokens (the deployment's step) is refused before anything runs, naming
    # the numbers (more sequences than a step holds are cut into micro-batches, as the trainer cuts them)
    with pytest.raises(SystemExit):
        main(["--model", str(path), "--prompts", "4", "--prompt-len", "100", "--new-tokens", "40", "--micro-batch",
              "4", *(f"--{k.replace('_', '-')}={v}" for k, v in {**LIMITS, "max_num_tokens": 128}.items()),
              "--out", str(out)])
    assert "a sequence of 100 + 40 tokens exceeds a trainer forward's budget of 128 tokens (the deployment's " \
        "max_num_tokens 128)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(path), *shape, "--families", "matmul,sampler", "--out", str(out)])
    assert "--families 'matmul,sampler'" in capsys.readouterr().err
    # one family searched, the others keep the tuple's values (and say so)
    assert main(["--model", str(path), "--dtype", "float32", *shape, "--no-check", "--families", "attention",
                 *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| attention" in text and "| matmul" not in text and "(family not asked for): " in text
    assert "step_graphs=False" in text  # --step-graphs auto: whole-step graphs on a CUDA device only (the runs')
    assert main(["--model", str(path), "--dtype", "float32", *shape, "--no-check", "--families", "rmsnorm",
                 "--step-graphs", *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()),
                 "--out", str(tmp_path / "pieces.json")]) == 0
    assert "step_graphs=True" in capsys.readouterr().out  # the flag alone: on
    assert "matmul" in text.split("(family not asked for): ")[1]
    # ... and with --commitment, they keep that tuple's values: a matmul site set to a legal non-default
    # assignment survives an attention-only search (without it the model's default would be written)
    sel = load_model(path, "detent", dtype=torch.float32, **LIMITS).selections
    start = sel.resolved()
    key, sol = next((k, sel.solution(f, **site)) for k, (f, site) in sorted(sel.sites().items())
                    if f == "matmul" and len(sel.solution(f, **site).legal) > 1)
    default = sol.assignment(dict(start.sites[key].pins), dict(start.sites[key].knobs))
    other = next(a for a in sol.legal if a != default)
    start.with_sites({key: SiteCommitment(*sol.split(other))}).save(tmp_path / "start.json")
    assert main(["--model", str(path), "--dtype", "float32", *shape, "--no-check", "--families", "attention",
                 "--commitment", str(tmp_path / "start.json"),
                 *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items()), "--out", str(out)]) == 0
    kept = CommitmentTuple.load(out).sites[key]
    assert sol.assignment(dict(kept.pins), dict(kept.knobs)) == other != default
    capsys.readouterr()
    with pytest.raises(SystemExit):  # made for other limits: refused, naming the mismatch
        main(["--model", str(path), "--dtype", "float32", *shape, "--commitment", str(tmp_path / "start.json"),
              "--out", str(out)])
    assert "--commitment: " in (err := capsys.readouterr().err) and "deployment: max_context: tuple 256" in err
    with pytest.raises(SystemExit):
        main(["--recipe", "r.yaml", "--commitment", str(tmp_path / "start.json"), "--out", str(out)])
    assert "--commitment cannot be given with it" in capsys.readouterr().err


def test_cold_copies_rotate_over_enough_bytes():
    from detent_rl.timing import cold_copies
    t = torch.arange(10, dtype=torch.float32)  # 40 bytes
    nxt = cold_copies(t, nbytes=100)
    seen = [nxt() for _ in range(6)]
    assert seen[0] is t and all(torch.equal(s, t) for s in seen)
    ptrs = [s.data_ptr() for s in seen]
    assert len(set(ptrs[:3])) == 3 and ptrs[3:] == ptrs[:3]  # three copies, 120 bytes >= 100, in turn
    assert cold_copies(t)() is t and cold_copies(t)() is t  # on the CPU: no copies by default


def test_with_the_gated_epilogue_on_the_gate_up_site_is_timed_as_the_mlp_runs_it(tmp_path, monkeypatch):
    """`DETENT_GATED_MLP=1`: the gate/up site's candidates are timed through `gate_up_silu` (the MLP's one launch,
    or its two kernels where a schedule is not fusable), every other site as `linear`; off, the gate/up site too
    is `linear` alone, and the stock arm's MLP never takes the epilogue."""
    from detent_rl.tune import _gated_mlp, _launcher
    path = save(hf_model("qwen2"), tmp_path / "m")
    gen = torch.Generator().manual_seed(0)
    widths = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("DETENT_GATED_MLP", flag)
        model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
        layer = model.model.layers[0]
        for name, lin in (("gate_up", layer.mlp.gate_up_proj), ("qkv", layer.self_attn.qkv_proj)):
            site = dict(zip(("n", "k"), lin.weight.shape))
            out = _launcher(model, "matmul", site, (3,), gen)(model.selections.get("matmul", **site)(3))()
            widths[flag, name] = tuple(out.shape)
    inter, qkv = model.config.intermediate_size, layer.self_attn.qkv_proj.weight.shape[0]
    assert widths["1", "gate_up"] == (3, inter)  # SiLU-and-mul's output: what the MLP's epilogue path returns
    assert widths["0", "gate_up"] == (3, 2 * inter)  # the projection alone
    assert widths["1", "qkv"] == widths["0", "qkv"] == (3, qkv)
    monkeypatch.setenv("DETENT_GATED_MLP", "1")
    stock = load_model(path, "stock", dtype=torch.float32, **LIMITS)
    assert _gated_mlp(stock, dict(zip(("n", "k"), stock.model.layers[0].mlp.gate_up_proj.weight.shape))) is None


def test_a_search_best_is_kept_only_for_a_saving_re_timed_beside_the_default():
    """The search keeps the minimum of single timings (the luckiest): its best is re-timed beside the default,
    rounds alternating which goes first, and kept only where its median saves MIN_GAIN."""
    from detent_rl.tune_search import MIN_GAIN, confirm
    order = []

    def cost_of(times):
        def cost(a):
            order.append(a)
            return times[a].pop(0)
        return cost
    # a 1 % saving (the search had timed it 20 % faster once): the default stays
    kept, d, b = confirm(("d",), ("b",), cost_of({("d",): [1.0, 1.02, 0.98], ("b",): [0.99, 0.97, 1.0]}), 3)
    assert kept == ("d",) and (d, b) == (1.0, 0.99)
    assert order == [("d",), ("b",), ("b",), ("d",), ("d",), ("b",)]  # alternating which goes first
    # a 10 % saving: kept (control)
    kept, d, b = confirm(("d",), ("b",), cost_of({("d",): [1.0, 1.1, 0.95], ("b",): [0.9, 0.88, 0.93]}), 3)
    assert kept == ("b",) and b <= d * (1 - MIN_GAIN)
    assert confirm(("d",), ("b",), cost_of({("d",): [1.0], ("b",): [0.99]}), 1, min_gain=0.0)[0] == ("b",)


def test_the_tuner_reports_a_search_best_it_did_not_keep(tmp_path, monkeypatch):
    """With every move needing more than it can save, each site keeps its default, the report says which best
    it turned down, and the prediction is no saving; with no threshold the searches' bests are kept (control)."""
    import detent_rl.tune_search as search_module
    path = save(hf_model("qwen2"), tmp_path / "m")
    model = load_model(path, "detent", dtype=torch.float32, **LIMITS)
    workload = Workload(prompts=2, prompt_len=12, new_tokens=3, micro_batch=2)
    monkeypatch.setattr(search_module, "MIN_GAIN", 1.0)  # a saving of the whole site's time: never
    out, report = tune(model, workload, repeats=1, families=("attention", "matmul"), log=lambda _: None)
    moved = [s for s in report.sites if s.rejected is not None]
    assert moved, "the searches found nothing other than the defaults: the check proves nothing"
    assert all(s.best == s.default and s.default_s == s.best_s for s in report.sites)
    assert report.predicted_saving_s == 0
    assert all(f"{s.key}: kept the default" in report.render() for s in moved)
    resolved = model.selections.resolved()
    assert all(out.sites[s.key] == resolved.sites[s.key] for s in report.sites)
    monkeypatch.setattr(search_module, "MIN_GAIN", float("-inf"))
    _, free = tune(model, workload, repeats=1, families=("attention", "matmul"), log=lambda _: None)
    assert all(s.rejected is None for s in free.sites) and any(s.best != s.default for s in free.sites)

"""The engine's warm-up (`rollout/warmup.py`): it changes no request's bits, runs one step per class of steps
the kernels tell apart, and on the GPU leaves an online serve nothing to compile."""
from __future__ import annotations

import random
import sys

import pytest
import torch

from detent_rl.kernels.launch import counting_compiles
from detent_rl.models import load_model
from detent_rl.rollout import warmup as warmup_mod
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from test_models import LIMITS, VOCAB, hf_model, save


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(48)]  # whole pages the prefix cache keeps
    return [shared + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def _params(n: int) -> list[SamplingParams]:
    return [SamplingParams(seed=50 + i, temperature=1.0, max_tokens=5) for i in range(n)]


def _outputs(seqs) -> list[tuple[list[int], list[float]]]:
    return [(s.completion, s.logprobs) for s in seqs]


def test_candidate_steps_cover_every_token_count_within_the_limits():
    steps = warmup_mod.candidate_steps(max_tokens=300, max_rows=8, max_len=200, chunk=64)
    prefills = {sum(q) for q, c in steps if not any(c)}
    assert set(range(1, 300 + 1)) <= prefills
    for q, c in steps:
        assert len(q) <= 8 and sum(q) <= 300 and all(x + y <= 200 for x, y in zip(q, c)), (q, c)
    lengths = {max(x + y for x, y in zip(q, c)) for q, c in steps if any(c)}
    assert lengths == set(range(64, 200 + 1, 64))


def _warmed_run(model, flush: bool, monkeypatch) -> list:
    engine = Engine(model, num_blocks=64, chunk_size=32)
    prompts, params = _prompts(3, seed=1), _params(3)
    engine.generate(prompts, params)  # its prompts' whole pages now in the prefix cache
    if not flush:  # the control: the warm-up's keys left under the cached prefixes
        monkeypatch.setattr(engine, "flush_cache", lambda: None)
    report = engine.warmup()
    monkeypatch.undo()
    assert report["steps"] > 0
    return _outputs(engine.generate(prompts, params))


def test_warmup_changes_no_requests_bits(tmp_path, monkeypatch):
    model = load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS)
    fresh = _outputs(Engine(model, num_blocks=64, chunk_size=32).generate(_prompts(3, seed=1), _params(3)))
    assert _warmed_run(model, True, monkeypatch) == fresh
    # negative control: without the flush a request reads the warm-up's keys where its cached prefix was
    assert _warmed_run(model, False, monkeypatch) != fresh


def test_warmup_runs_one_step_per_class(tmp_path):
    path = save(hf_model("qwen2"), tmp_path)
    lengths = {}
    for arm in ("detent", "stock"):
        engine = Engine(load_model(path, arm, dtype=torch.float32, **LIMITS), num_blocks=64, chunk_size=32)
        plan, steps = warmup_mod._Plan(engine), warmup_mod.planned_steps(engine)
        keys = [plan.key(q, c, w) for q, c, w in steps]
        assert len(set(keys)) == len(keys) and engine.warmup()["steps"] == len(steps) and engine.idle
        # sampled-row counts and table widths of each of Triton's integer classes (1, a multiple of 16, other)
        classes = {(True, False), (False, True), (False, False)}
        assert {(len(q) == 1, len(q) % 16 == 0) for q, _, _ in steps} == classes
        assert {(w == 1, w % 16 == 0) for _, _, w in steps} == classes
        # the two-token steps at every swept context length: the split sizes their selections give, and how many
        # classes they fall in
        two = [(q, c) for q, c in warmup_mod.candidate_steps(64, 16, 255, 32) if q == [2] and any(c)]
        sizes = {engine.model.select_attention(1, 2, 2, c[0] + 2).split_size for _, c in two}
        lengths[arm] = len(sizes), len({plan.key(q, c, 4) for q, c in two})
        # a pinned arm compiles its one split size in (a constexpr: in the key), the stock arm passes it at run time
        assert {plan.key(q, c, 4)[0][-1] for q, c in two} == (sizes if arm == "detent" else {None})
        # a chunk beside every count of decode rows, at every swept length (the stock split count reads the rows)
        mixed = {(len(q), c[0] + q[0]) for q, c in warmup_mod.candidate_steps(64, 16, 255, 32)
                 if len(q) > 1 and q[1:] == [1] * (len(q) - 1) and any(c)}
        assert mixed == {(rows, length) for rows in range(2, 17) for length in range(64, 256, 64)}
    # the stock arm's attention selection reads the context length (its split size), the pinned one's does not; a
    # split size is a runtime argument of the stock arm's kernels, so it makes no class of its own
    assert lengths["detent"] == (1, 1) and lengths["stock"][0] > 1 and lengths["stock"][1] < lengths["stock"][0]


def test_the_rollout_section_warms_the_engine_up_where_asked(tmp_path):
    from detent_rl.config import RolloutSection
    from detent_rl.workers import GenerateRequest, ModelSpec, RolloutWorker

    spec = ModelSpec(str(save(hf_model("qwen2"), tmp_path)), "detent", "cpu", "float32", max_context=128,
                     max_batch=16, max_num_tokens=128)
    request = GenerateRequest(_prompts(4, seed=2), _params(4))
    outs = {}
    for warm in ("auto", "on", "off"):
        worker = RolloutWorker(spec, RolloutSection(max_num_seqs=16, cuda_graphs="off", warmup=warm, top_k=20))
        assert (worker.warmup is not None) == (warm == "on")  # auto: the GPU only (the CPU compiles nothing)
        outs[warm] = [(c.tokens, c.logprobs) for c in worker.generate(request)]
    assert outs["on"] == outs["off"] == outs["auto"]


def test_warmup_refuses_a_busy_engine(tmp_path):
    engine = Engine(load_model(save(hf_model("qwen2"), tmp_path), "detent", dtype=torch.float32, **LIMITS),
                    num_blocks=64)
    engine.add([1, 2, 3], SamplingParams(seed=1))
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.warmup()


def _forget_compiled() -> None:
    """Drop every compiled variant of our kernels from Triton's in-process caches (the disk cache makes the
    next compile a load, which still counts)."""
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if name.startswith("detent_rl.kernels"):
            for value in vars(module).values():
                if isinstance(value, JITFunction):
                    value.device_caches.clear()


def _serve_online(engine: Engine) -> None:
    """Requests of varied lengths added while others run, as online serving mixes them."""
    rng = random.Random(5)
    pending = [([rng.randrange(VOCAB) for _ in range(rng.randint(1, 120))],
                SamplingParams(seed=i, temperature=1.0, max_tokens=rng.randint(1, 40))) for i in range(24)]
    while pending or not engine.idle:
        for _ in range(rng.randint(0, 3)):
            if pending:
                engine.add(*pending.pop())
        if not engine.idle:
            engine.step()


@pytest.mark.gpu
@pytest.mark.parametrize("arm,dtype,whole", [("detent", torch.bfloat16, False), ("stock", torch.bfloat16, False),
                                             ("detent", torch.float32, False), ("detent", torch.bfloat16, True)],
                         ids=["detent-bf16", "stock-bf16", "detent-fp32", "detent-bf16-whole"])
def test_gpu_warmup_leaves_an_online_serve_nothing_to_compile(tmp_path, arm, dtype, whole):
    """`whole`: the runs' default engine on the GPU (`rollout.step_graphs: auto`), whose warm-up also captures every
    size's whole-step graph."""
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, device="cuda", dtype=dtype, **LIMITS)
    _forget_compiled()
    engine = Engine(model, num_blocks=64, chunk_size=64, full_steps=whole)
    report = engine.warmup()
    extra = report["graphs"] - len(engine.graphs.sizes)  # whole: the sizes its synthetic steps did not capture
    assert report["compiled"] > 0 and (extra >= 0 if whole else extra == 0)
    assert not whole or set(engine.steps.whole) == set(engine.steps.sizes)  # every size's whole graph captured
    runs = sum(engine.steps.whole_runs.values()) if whole else 0
    with counting_compiles() as compiled:
        _serve_online(engine)
    assert compiled == []
    assert not whole or sum(engine.steps.whole_runs.values()) > runs  # the serve's eager steps went through them
    # negative control: the same serve on a cold engine compiles inside its steps
    _forget_compiled()
    with counting_compiles() as compiled:
        _serve_online(Engine(model, num_blocks=64, chunk_size=64, full_steps=whole))
    assert compiled


def test_the_warmup_plan_bench_counts_each_arms_steps_without_a_device(monkeypatch, capsys):
    """`bench/warmup_plan.py` (the warm-up's cost in steps, per arm, on the meta device): a row per arm and
    setting, whose kinds add up to its steps; det's one schedule for every M needs the fewest classes."""
    import importlib.util
    from pathlib import Path
    bench = Path(__file__).resolve().parent.parent / "bench" / "warmup_plan.py"
    spec = importlib.util.spec_from_file_location("warmup_plan", bench)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["warmup_plan.py", "--model", "tiny", "--step-graphs", "off,on"])
    mod.main()
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    table = {(r[0].strip(), r[1].strip()): [int(v) for v in r[2:6]] for r in rows}
    assert set(table) == {(a, g) for a in ("stock", "detent", "corun", "det") for g in ("off", "on")}
    assert all(steps == sum(kinds) > 0 for steps, *kinds in table.values())
    assert table[("det", "on")][0] < table[("detent", "on")][0]

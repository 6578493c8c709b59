"""Tensor parallelism on CPU ranks (gloo): the all-reduce's algorithms and their pin, and a model cut over
two ranks whose engine and trainer agree bit for bit.

- The all-reduce (four ranks): one-shot and two-shot sum in the orders they fix (equal to a one-process
  reference), whatever the message size; gloo's own all-reduce (what "nccl" runs on the CPU) changes a
  row's bf16 bits with the message size, and so does the stock selection, which moves between
  algorithms as the message grows past the workspaces. Pinned, a row's bits stay.
- The model (two ranks, a checkpoint made by transformers): every rank samples the same tokens; a
  request's tokens and logprobs are the same alone and in a batch; the trainer's rescoring of the
  rollout (one prefill of every sequence, `completion_logprobs`) and the grad-enabled forwards of two
  GRPO steps give the rollout's logprobs bit for bit; the ranks keep equal losses, gradient norms and
  replicated weights, and a checkpoint restores exactly. Control: the stock arm misses the bits in one
  of those checks (its CPU GEMM rounds a one-row decode step's rows differently from a batch's or a
  prefill's; at two ranks every all-reduce algorithm adds two values once, so agrees). The stock arm
  runs fp32 on the CPU: on the AVX2 EPYC of 2026-12 a bf16 linear reads no M (tests/test_dp_rollout.py).
  The TP model's logits match transformers' within bf16 tolerance and its gradient norm one rank's; its
  bits differ from one rank's (row-parallel partials are rounded before the sum), and the test measures
  by how much.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from test_dp_rollout import WIDE, assert_cpu_gemm_reads_m
from test_models import hf_model, save


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, port: int, device: str = "cpu") -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)


def _spawn(fn, world: int, *args) -> None:
    mp.spawn(fn, args=(world, _free_port(), *args), nprocs=world, join=True)


# ----------------------------------------------------------------------------------------------
# The all-reduce
# ----------------------------------------------------------------------------------------------
HIDDEN = 64
ROWS = (1, 3, 8, 40, 200, 1000)  # the message's token count: 128 B to 125 KiB
WORKSPACE = dict(push_workspace=1024, pull_workspace=32 * 1024)  # small, so these sizes cross them


def _all_reduce_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from detent_rl.kernels.allreduce import all_gather, all_reduce, all_reduce_reference
    from detent_rl.kernels.programs.allreduce import allreduce_program
    from detent_rl.selir.solver import solve
    _init(rank, world, port)
    g = torch.Generator().manual_seed(rank)
    base = (torch.randn(max(ROWS), HIDDEN, generator=g) * torch.logspace(-3, 3, HIDDEN)).to(torch.bfloat16)
    sol = solve(allreduce_program, {"world_size": world, "max_nbytes": max(ROWS) * HIDDEN * 2, **WORKSPACE})
    stock = sol.stock()
    report: dict = {"first_row": {}, "matches_reference": {}, "stock_algorithms": []}
    for algorithm in ("one_shot_push", "two_shot_push", "nccl", "stock"):
        rows = []
        for n in ROWS:
            x = base[:n]
            chosen = stock(n * HIDDEN * 2, False).algorithm if algorithm == "stock" else algorithm
            if algorithm == "stock":
                report["stock_algorithms"].append(chosen)
            y = all_reduce(x, chosen, None)
            if chosen != "nccl":
                want = all_reduce_reference(all_gather(x), chosen)
                report["matches_reference"].setdefault(chosen, []).append(torch.equal(y, want))
            rows.append(y[0].view(torch.int16).tolist())
        report["first_row"][algorithm] = [r == rows[0] for r in rows]
    for dtype in (torch.bfloat16, torch.float32):  # bf16 partials: the same bits by either order (below)
        parts = all_gather(torch.randn(8, HIDDEN, generator=g).to(dtype))
        report[f"one_vs_two_shot_differ_{str(dtype)[6:]}"] = not torch.equal(
            all_reduce_reference(parts, "one_shot_push"), all_reduce_reference(parts, "two_shot_push"))
    if rank == 0:
        Path(out).write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def test_the_pinned_all_reduce_keeps_a_rows_bits_and_the_stock_one_does_not(tmp_path):
    out = tmp_path / "ar.json"
    _spawn(_all_reduce_rank, 4, str(out))
    r = json.loads(out.read_text())
    assert all(all(v) for v in r["matches_reference"].values()), r["matches_reference"]
    assert all(r["first_row"]["one_shot_push"]) and all(r["first_row"]["two_shot_push"])
    assert not all(r["first_row"]["nccl"]), "control: gloo's own bf16 all-reduce should follow the message size"
    assert len(set(r["stock_algorithms"])) > 2 and "nccl" in r["stock_algorithms"]
    assert not all(r["first_row"]["stock"]), "control: the stock selection should change a row's bits"
    # The two fixed orders are different sums of fp32 partials (so the pin is a choice of bits, not only
    # of speed). Four bf16 partials accumulated in fp32 are summed exactly here, so either order rounds
    # to the same bf16: the model's all-reduce differs from rank order only where NCCL rounds per hop.
    assert r["one_vs_two_shot_differ_float32"]
    assert not r["one_vs_two_shot_differ_bfloat16"]


# ----------------------------------------------------------------------------------------------
# The model over two ranks
# ----------------------------------------------------------------------------------------------
LIMITS = dict(max_context=64, max_batch=16, max_num_tokens=256)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in torch.randint(5, 21, (6,), generator=g)]


def _model_rank(rank: int, world: int, port: int, path: str, arm: str, out: str, device: str = "cpu",
                dtype_name: str = "bfloat16", full_steps: bool = False) -> None:
    import torch.distributed as dist
    from detent_rl.kernels.selections import KernelSelections
    from detent_rl.models import ModelConfig, deployment_for, load_model
    from detent_rl.models.parallel import TensorParallel
    from detent_rl.models.runner import completion_logprobs
    from detent_rl.rollout.engine import Engine
    from detent_rl.rollout.sequence import SamplingParams
    _init(rank, world, port, device)
    tp = TensorParallel.from_group()
    config = ModelConfig.from_file(Path(path))
    dtype = getattr(torch, dtype_name)
    selections = KernelSelections(deployment_for(config, dtype, tp_size=world, **LIMITS), arm)
    model = load_model(path, selections, device=f"cuda:{rank}" if device == "cuda" else "cpu", dtype=dtype, tp=tp)
    prompts = _prompts()
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=6) for i in range(len(prompts))]
    # graphs capture the collectives; `full_steps`: prefill steps through whole-step graphs (the runs' GPU default)
    engine = Engine(model, num_blocks=64, cuda_graphs=device == "cuda", full_steps=full_steps)
    batch = engine.generate(prompts, params)
    alone = [engine.generate([p], [s])[0] for p, s in zip(prompts, params)]
    seqs = [(s.tokens, s.num_prompt) for s in batch]
    with torch.no_grad():
        rescored = completion_logprobs(model, seqs, [1.0] * len(seqs))
        logits = model.logits(_hidden(model, batch[0].tokens)).float()
    train = _train_two_steps(engine, model, prompts, out, rank)
    report = {
        **train,
        "tokens": [s.tokens for s in batch],
        "alone_equal": [a.tokens == b.tokens and a.logprobs == b.logprobs for a, b in zip(alone, batch)],
        "rescored_equal": [torch.equal(t.cpu(), torch.tensor(s.logprobs, dtype=torch.float32))
                           for t, s in zip(rescored, batch)],
        "rescored": [t.cpu().tolist() for t in rescored],
        "logits": logits.cpu().tolist(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _digest(params) -> str:
    import hashlib
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def _train_two_steps(engine, model, prompts, out: str, rank: int) -> dict:
    """Two GRPO steps of the rank's trainer on its engine's rollouts (the engine taking the trainer's
    weights between them); then step 2 again from a checkpoint of step 1."""
    from detent_rl.config import TrainSection
    from detent_rl.models.parallel import is_sharded
    from detent_rl.rollout.sequence import SamplingParams
    from detent_rl.trainer.trainer import Sample, Trainer
    trainer = Trainer(model, TrainSection(lr=1e-3, micro_batch_size=2, grad_clip=1.0))
    report: dict = {"train_equal": [], "digests": [], "replicated": [], "grad_norms": [], "losses": []}
    batches = []
    for step in (1, 2):
        seqs = engine.generate(prompts, [SamplingParams(seed=100 * step + i, temperature=1.0, max_tokens=6)
                                         for i in range(len(prompts))])
        samples = [Sample(f"{step}:{i}", s.tokens, s.num_prompt, s.logprobs, 1.0, 100 * step + i, 0.0,
                          advantage=(1.0 if i % 2 else -1.0)) for i, s in enumerate(seqs)]
        batches.append(samples)
        if step == 1:
            report["batch1"] = [(x.tokens, x.num_prompt, x.rollout_logprobs) for x in samples]
        if step == 2:
            trainer.save_state(Path(out) / f"ckpt{rank}")
        stats, seen = trainer.train_checked(samples)
        report["train_equal"].append([torch.equal(t.cpu(), torch.tensor(s.rollout_logprobs, dtype=torch.float32))
                                      for t, s in zip(seen, samples)])
        report["digests"].append(_digest(trainer.params))
        report["replicated"].append(_digest([p for p in trainer.params if not is_sharded(p)]))
        report["grad_norms"].append(stats.grad_norm)
        report["losses"].append(stats.loss)
        engine.update_weights(trainer.compute_weights())
    trainer.load_state(Path(out) / f"ckpt{rank}")
    trainer.train_checked(batches[1])
    report["replayed"] = _digest(trainer.params)
    return report


def _hidden(model, tokens: list[int]) -> torch.Tensor:
    from detent_rl.models import set_context
    from detent_rl.models.runner import Span, step_inputs
    caches = model.allocate_kv_cache(-(-len(tokens) // model.page_size))
    ids, positions, ctx = step_inputs(model, caches, [Span(list(tokens), 0, list(range(len(caches[0][0]))))])
    with set_context(ctx):
        return model(ids, positions)


@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_a_two_rank_model_samples_and_rescores_the_same_bits(tmp_path, arm):
    from detent_rl.models import load_model
    from detent_rl.models.runner import completion_logprobs
    hf = hf_model("qwen2", **WIDE)
    path = save(hf, tmp_path / "wide")
    if arm == "stock":
        assert_cpu_gemm_reads_m(1, 6)
    _spawn(_model_rank, 2, str(path), arm, str(tmp_path), "cpu", "bfloat16" if arm == "detent" else "float32")
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["tokens"] == reports[1]["tokens"], "the ranks sampled different tokens"
    assert reports[0]["rescored"] == reports[1]["rescored"]
    # training: the same loss, gradient norm and replicated weights on both ranks, their parts moving
    for key in ("losses", "grad_norms", "replicated", "train_equal"):
        assert reports[0][key] == reports[1][key], key
    assert all(x["digests"][0] != x["digests"][1] for x in reports)
    assert all(x["replayed"] == x["digests"][1] for x in reports), "the checkpoint did not restore step 1 exactly"
    r = reports[0]
    assert all(t[:len(p)] == p for t, p in zip(r["tokens"], _prompts()))
    # the sharded model is the checkpoint's model: transformers' logits within bf16 rounding
    tokens = r["tokens"][0]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].float()
    got = torch.tensor(r["logits"])
    print(f"{arm}: TP=2 logits vs transformers: max |difference| {(got - want).abs().max():.4g} "
          f"(max |logit| {want.abs().max():.4g})")
    assert (got - want).abs().max() < 0.03 * want.abs().max()
    if arm == "detent":
        assert all(r["alone_equal"]), r["alone_equal"]
        assert all(r["rescored_equal"]), r["rescored_equal"]
        assert all(all(step) for step in r["train_equal"]), r["train_equal"]  # step 2: after the weight sync
        # against one rank: the same checkpoint, arm and kernels, rescored whole. Not bit-equal (the
        # row-parallel partials round before their sum); the gap is measured, and must stay small
        one = load_model(str(path), "detent", dtype=torch.bfloat16, **LIMITS)
        with torch.no_grad():
            ref = completion_logprobs(one, [(t, len(p)) for t, p in zip(r["tokens"], _prompts())], [1.0] * 6)
        gap = max((torch.tensor(a) - b).abs().max().item() for a, b in zip(r["rescored"], ref))
        print(f"TP=2 vs TP=1 rescoring: max |logprob difference| {gap:.4g}")
        assert 0 < gap < 0.5
        # the sharded backward is the whole model's: one rank's trainer on step 1's batch
        from detent_rl.config import TrainSection
        from detent_rl.trainer.trainer import Sample, Trainer
        samples = [Sample(f"1:{i}", t, n, lp, 1.0, 100 + i, 0.0, advantage=(1.0 if i % 2 else -1.0))
                   for i, (t, n, lp) in enumerate(r["batch1"])]
        stats, _ = Trainer(one, TrainSection(lr=1e-3, micro_batch_size=2, grad_clip=1.0)).train_checked(samples)
        print(f"step 1 gradient norm: TP=2 {r['grad_norms'][0]:.6g}, TP=1 {stats.grad_norm:.6g}; "
              f"loss {r['losses'][0]:.6g} vs {stats.loss:.6g}")
        assert r["grad_norms"][0] == pytest.approx(stats.grad_norm, rel=2e-2)
        assert r["losses"][0] == pytest.approx(stats.loss, rel=2e-2, abs=1e-3)
    else:  # the same checks: a request alone and batched, the rollout rescored, the trainer's forwards
        flags = [*r["alone_equal"], *r["rescored_equal"], *(x for step in r["train_equal"] for x in step)]
        assert not all(flags), "control: the stock arm should miss the rollout's bits somewhere"


# ----------------------------------------------------------------------------------------------
# Bits equal across TP degrees (TensorParallel.invariant with matching commitment tuples)
# ----------------------------------------------------------------------------------------------
ALIGNED = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2)  # each rank's K of o_proj (256) and down_proj (512): whole 128-chunks


def _rollout(model, prompts) -> list:
    from detent_rl.rollout.engine import Engine
    from detent_rl.rollout.sequence import SamplingParams
    engine = Engine(model, num_blocks=64, cuda_graphs=False)
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=6) for i in range(len(prompts))]
    seqs = engine.generate(prompts, params)
    return [(s.tokens, s.num_prompt, s.logprobs) for s in seqs]


def _invariant_rank(rank: int, world: int, port: int, path: str, invariant: bool, one_gpu: list, out: str) -> None:
    import torch.distributed as dist
    from detent_rl.kernels.selections import KernelSelections
    from detent_rl.models import ModelConfig, deployment_for, load_model
    from detent_rl.models.parallel import TensorParallel
    from detent_rl.models.runner import completion_logprobs
    from detent_rl.models.tp_invariant import tp_invariant_commitments
    _init(rank, world, port)
    config = ModelConfig.from_file(Path(path))
    deployment = deployment_for(config, torch.bfloat16, tp_size=world, **LIMITS)
    tuple_ = tp_invariant_commitments(config, torch.bfloat16, world, **LIMITS)[1] if invariant else None
    model = load_model(path, KernelSelections(deployment, "detent", tuple_), dtype=torch.bfloat16,
                       tp=TensorParallel.from_group(invariant=invariant))
    rolled = _rollout(model, _prompts())
    with torch.no_grad():  # the one-GPU rollout, rescored over the ranks
        rescored = completion_logprobs(model, [(t, n) for t, n, _ in one_gpu], [1.0] * len(one_gpu))
    report = {"rollout_equal": rolled == [tuple(x) for x in one_gpu],
              "rescored_equal": [torch.equal(r, torch.tensor(lp)) for r, (_, _, lp) in zip(rescored, one_gpu)]}
    Path(out, f"inv{int(invariant)}_rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def test_tp_invariant_mode_gives_one_gpus_bits(tmp_path):
    """With `tp_invariant_commitments`' pair of tuples and `TensorParallel(invariant=True)`, two ranks
    sample exactly one GPU's tokens and logprobs, and rescore a one-GPU rollout bit for bit. Control: the
    default TP mode (bf16 partials summed) misses them."""
    from detent_rl.kernels.selections import KernelSelections
    from detent_rl.models import ModelConfig, deployment_for, load_model
    from detent_rl.models.tp_invariant import tp_invariant_commitments
    path = save(hf_model("qwen2", **ALIGNED), tmp_path / "aligned")
    config = ModelConfig.from_file(path)
    one_tuple = tp_invariant_commitments(config, torch.bfloat16, 2, **LIMITS)[0]
    one = load_model(str(path), KernelSelections(deployment_for(config, torch.bfloat16, **LIMITS), "detent",
                                                 one_tuple), dtype=torch.bfloat16)
    one_gpu = _rollout(one, _prompts())
    for invariant in (True, False):
        _spawn(_invariant_rank, 2, str(path), invariant, one_gpu, str(tmp_path))
    reports = {inv: [json.loads((tmp_path / f"inv{inv}_rank{r}.json").read_text()) for r in range(2)] for inv in (0, 1)}
    assert reports[1][0] == reports[1][1]
    assert reports[1][0]["rollout_equal"] and all(reports[1][0]["rescored_equal"]), reports[1][0]
    assert not reports[0][0]["rollout_equal"] and not any(reports[0][0]["rescored_equal"]), reports[0][0]


@pytest.mark.gpu
@pytest.mark.parametrize("whole", [False, True], ids=["decode-graphs", "whole-steps"])
@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_two_gpus_sample_and_rescore_the_same_bits(tmp_path, arm, whole):
    """The same on two GPUs: NCCL, the Triton kernels, the decode steps as CUDA graphs that capture the
    collectives (`whole`: the prefill steps too, through whole-step graphs, as a run's engine on the GPU takes
    them). Control: the stock arm (cuBLAS, the all-reduce by message size) misses the bits."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (the device's nvidia-h200-x2 kind)")
    path = save(hf_model("qwen2", **WIDE), tmp_path / "wide")
    _spawn(_model_rank, 2, str(path), arm, str(tmp_path), "cuda", "bfloat16", whole)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["tokens"] == reports[1]["tokens"] and reports[0]["rescored"] == reports[1]["rescored"]
    r = reports[0]
    flags = [*r["alone_equal"], *r["rescored_equal"], *(x for step in r["train_equal"] for x in step)]
    if arm == "detent":
        assert all(flags), r
    else:
        assert not all(r["rescored_equal"]), "control: the stock arm's rescoring should miss the rollout's bits"

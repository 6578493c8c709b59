"""The trainer under DeepSpeed ZeRO-2 on two CPU ranks (gloo): the forward of every micro-batch, on
whichever rank it is dealt to, gives the rollout's logprobs bit for bit, on two consecutive steps
(the second after the engine took the updated weights); the ranks hold equal weights after each
step; a ZeRO checkpoint restores a step exactly. The engine decodes at most 3 sequences a step. Control:
in the stock arm the same check fails (its CPU GEMM rounds a trainer micro-batch's rows other than the
rollout's decode steps of 2-3 rows at this width, as tests/test_dp_rollout.py's replicas show). The
stock arm runs fp32: on the AVX2 EPYC of 2026-12 a bf16 linear reads no M, and an fp32 one splits
M <= 3 from M >= 4 (the test checks that premise first)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="the ZeRO trainer needs DeepSpeed (pip install -e '.[zero]')")

from test_dp_rollout import WIDE, assert_cpu_gemm_reads_m  # noqa: E402
from test_models import hf_model, save  # noqa: E402



def _digest(trainer) -> str:
    import hashlib
    h = hashlib.sha256()
    for p in trainer.params:
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def _batch(engine, step: int):
    from detent_rl.rollout.sequence import SamplingParams
    from detent_rl.trainer.trainer import Sample
    g = torch.Generator().manual_seed(step)
    prompts = [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in torch.randint(5, 21, (5,), generator=g)]
    seqs = engine.generate(prompts, [SamplingParams(seed=100 * step + i, temperature=1.0, max_tokens=6)
                                     for i in range(len(prompts))])
    return [Sample(f"{step}:{i}", s.tokens, s.num_prompt, s.logprobs, 1.0, 100 * step + i, 0.0,
                   advantage=(1.0 if i % 2 else -1.0)) for i, s in enumerate(seqs)]


def _rank(rank: int, world: int, path: str, arm: str, out: str, port: int) -> None:
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    from detent_rl.config import TrainSection
    from detent_rl.models import load_model
    from detent_rl.rollout.engine import Engine
    from detent_rl.trainer.zero import ZeroTrainer
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    limits = dict(max_context=64, max_batch=16, max_num_tokens=256)
    dtype = torch.bfloat16 if arm == "detent" else torch.float32  # (the control's dtype: the docstring says why)
    engine = Engine(load_model(path, arm, dtype=dtype, **limits), num_blocks=64, max_num_seqs=3)
    trainer = ZeroTrainer(load_model(path, arm, dtype=dtype, **limits),
                          TrainSection(lr=1e-3, micro_batch_size=2, grad_clip=1.0))
    report: dict = {"equal": [], "digests": [], "grad_norms": [], "losses": []}
    batches = []
    for step in (1, 2):
        samples = _batch(engine, step)
        batches.append(samples)
        if step == 2:
            trainer.save_state(Path(out) / "ckpt")  # after step 1
        stats, seen = trainer.train_checked(samples)
        report["equal"].append([torch.equal(t, torch.tensor(s.rollout_logprobs, dtype=torch.float32))
                                for t, s in zip(seen, samples)])
        report["digests"].append(_digest(trainer))
        report["tokens"] = stats.train_tokens
        report["grad_norms"].append(stats.grad_norm)
        report["losses"].append(stats.loss)
        engine.update_weights(trainer.compute_weights())
    trainer.load_state(Path(out) / "ckpt")  # back to step 1's state, then step 2 again
    trainer.train_checked(batches[1])
    report["replayed"] = _digest(trainer)
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_zero2_on_two_ranks_keeps_the_rollouts_bits_and_restores_exactly(tmp_path, arm):
    import torch.multiprocessing as mp
    if arm == "stock":  # the rollout decodes 3 rows a step; the trainer's micro-batch, 2 sequences of >= 11 tokens
        assert_cpu_gemm_reads_m(3, 22)  # (one thread, an AVX-512 Xeon: MKL's rows of 3 and 8 agree; of 3 and 16 not)
    path = save(hf_model("qwen2", **WIDE), tmp_path / "wide")
    mp.spawn(_rank, args=(2, str(path), arm, str(tmp_path), _free_port()), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # every rank returns the whole batch's logprobs and statistics; the ranks hold one set of weights
    assert reports[0]["equal"] == reports[1]["equal"] and reports[0]["tokens"] == reports[1]["tokens"] == 30
    assert reports[0]["digests"] == reports[1]["digests"] and reports[0]["digests"][0] != reports[0]["digests"][1]
    equal = [x for step in reports[0]["equal"] for x in step]
    assert len(equal) == 10
    if arm == "detent":
        assert all(equal), reports[0]["equal"]  # 3 micro-batches a step: rank 0 two, rank 1 one and a zero-weight pass
    else:
        assert not all(equal), "control: the stock arm's trainer forward should miss the rollout's bits"
    assert all(r["replayed"] == r["digests"][1] for r in reports), "the checkpoint did not restore step 1 exactly"
    if arm == "detent":  # one rank runs every micro-batch: the same loss and gradient, up to the sums' order
        (tmp_path / "one").mkdir()
        mp.spawn(_rank, args=(1, str(path), arm, str(tmp_path / "one"), _free_port()), nprocs=1, join=True)
        one = json.loads((tmp_path / "one" / "rank0.json").read_text())
        assert one["equal"] == reports[0]["equal"]
        assert one["losses"][0] == pytest.approx(reports[0]["losses"][0], rel=1e-5)
        assert one["grad_norms"][0] == pytest.approx(reports[0]["grad_norms"][0], rel=1e-3)  # no weight in the padding


def test_a_zero2_run_of_two_trainer_ranks_is_bit_equal_and_resumes_to_the_same_bits(tmp_path):
    """The run loop with `train.zero_stage: 2` over two trainer ranks (Ray actors in the run's placement
    group, beside one engine): every step bit-equal with KL 0 (the bit-check and GRPO's rescore taken
    on the ranks), the weights broadcast from rank 0 to the engine by the collective sync (its own
    process group beside the ranks' default one), and a run resumed from its step-3 DeepSpeed
    checkpoint repeats steps 4-6 exactly."""
    from test_train import _driver, _lines, _recipe, assert_resume_repeats
    zero = ("train.zero_stage=2", "train.num_gpus=2", "ray.num_cpus=3", "ray.weight_sync=collective")
    whole = tmp_path / "whole"
    _driver(_recipe(tmp_path, whole), *zero)
    rows = _lines(whole, "metrics.jsonl")
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert all(r["bit_match"] == 1.0 and r["kl_k1"] == 0.0 for r in rows.values()), rows
    assert len({r["weights_digest"] for r in rows.values()}) == 6  # the weights move every step
    transport = {json.loads(x)["weight_sync"] for x in (whole / "metrics.jsonl").read_text().splitlines()}
    assert transport == {"collective"}
    placed = json.loads((whole / "workers.json").read_text())["placement"]
    assert len(placed["trainer"]) == 2 and [b["CPU"] for b in placed["bundles"]] == [3.0]
    assert_resume_repeats(tmp_path, whole, rows, *zero)

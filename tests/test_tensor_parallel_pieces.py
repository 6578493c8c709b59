"""Tensor parallelism through the piecewise step graphs (rollout/step_graphs.py) and the whole-step graphs
(rollout/full_steps.py, the runs' GPU default): two ranks' engines, whose row-parallel all-reduces run inside the
graphs at the padded token count, pad every step alike and so stay in step;
in the pinned arm every request's tokens and logprobs are the eager engine's and its own alone. Control: the stock
arm moves them (on the CPU in fp32, where its GEMM reads the padded M; tests/test_tensor_parallel.py says why)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_dp_rollout import WIDE, assert_cpu_gemm_reads_m
from test_models import hf_model, save
from test_tensor_parallel import LIMITS, _init, _prompts, _spawn


def _pieces_rank(rank: int, world: int, port: int, path: str, arm: str, out: str, device: str,
                 dtype_name: str, mode: str) -> None:
    """The ranks' engines with and without step graphs (`mode` pieces: `rollout/step_graphs.py`; whole:
    `rollout/full_steps.py`; the row-parallel all-reduces run inside them, at the padded token count), under two
    chunkings: whether every request's tokens and logprobs are the same, whether each request alone through them
    gives its batch's, and how many steps ran through them."""
    import torch.distributed as dist
    from detent_rl.kernels.selections import KernelSelections
    from detent_rl.models import ModelConfig, deployment_for, load_model
    from detent_rl.models.parallel import TensorParallel
    from detent_rl.rollout.engine import Engine
    from detent_rl.rollout.sequence import SamplingParams
    _init(rank, world, port, device)
    config = ModelConfig.from_file(Path(path))
    dtype = getattr(torch, dtype_name)
    selections = KernelSelections(deployment_for(config, dtype, tp_size=world, **LIMITS), arm)
    model = load_model(path, selections, device=f"cuda:{rank}" if device == "cuda" else "cpu", dtype=dtype,
                       tp=TensorParallel.from_group())
    prompts = _prompts()
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=6) for i in range(len(prompts))]
    report: dict = {"equal": [], "pieced": 0, "tokens": []}
    graphs = {"full_steps": True} if mode == "whole" else {"step_graphs": True}
    for chunk in (64, 5):  # whole prompts in one step; 5-token chunks beside decode rows (mixed steps)
        options = dict(num_blocks=64, chunk_size=chunk, cuda_graphs=device == "cuda")
        want = Engine(model, **options).generate(prompts, params)
        engine = Engine(model, **graphs, **options)
        got = engine.generate(prompts, params)
        report["pieced"] += sum((engine.steps.whole_runs if mode == "whole" else engine.steps.runs).values())
        report["equal"] += [(a.tokens, a.logprobs) == (b.tokens, b.logprobs) for a, b in zip(want, got)]
        report["tokens"].append([s.tokens for s in got])
    alone = [Engine(model, num_blocks=64, cuda_graphs=device == "cuda", **graphs).generate([p], [sp])[0]
             for p, sp in zip(prompts, params)]
    report["alone_equal"] = [(a.tokens, a.logprobs) == (b.tokens, b.logprobs) for a, b in zip(alone, got)]
    Path(out, f"pieces_rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _pieces_reports(tmp_path, arm: str, device: str, dtype_name: str, mode: str) -> dict:
    path = save(hf_model("qwen2", **WIDE), tmp_path / "wide")
    _spawn(_pieces_rank, 2, str(path), arm, str(tmp_path), device, dtype_name, mode)
    reports = [json.loads((tmp_path / f"pieces_rank{r}.json").read_text()) for r in range(2)]
    assert reports[0] == reports[1], "the ranks' engines went different ways through the pieces"
    assert reports[0]["pieced"] > 0, f"no step ran through the step graphs ({mode})"
    return reports[0]


@pytest.mark.parametrize("mode", ["pieces", "whole"])
@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_two_ranks_through_the_pieces_keep_the_eager_steps_bits(tmp_path, arm, mode):
    """Two CPU ranks through the pieces or the whole-step graphs (eager): the detent arm keeps the eager engine's
    bits and each request's own alone. Control: the stock arm (fp32, its CPU GEMM reading the padded M) moves
    them."""
    if arm == "stock":
        assert_cpu_gemm_reads_m(1, 16)
    r = _pieces_reports(tmp_path, arm, "cpu", "bfloat16" if arm == "detent" else "float32", mode)
    if arm == "detent":
        assert all(r["equal"]) and all(r["alone_equal"]), r
    else:
        assert not all(r["equal"]), "negative control: the stock arm's padded steps kept every bit"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["pieces", "whole"])
@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_two_gpus_through_the_captured_pieces_keep_the_eager_steps_bits(tmp_path, arm, mode):
    """The same on two GPUs: the pieces or whole steps captured as CUDA graphs, NCCL's or the pinned all-reduce inside.
    Control: the stock arm (cuBLAS at the padded count, the attention split and the all-reduce by size) moves the
    bits of some request, through the pieces or alone against the batch."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (the device's nvidia-h200-x2 kind)")
    r = _pieces_reports(tmp_path, arm, "cuda", "bfloat16", mode)
    if arm == "detent":
        assert all(r["equal"]) and all(r["alone_equal"]), r
    else:
        assert not all(r["equal"] + r["alone_equal"]), "negative control: the stock arm kept every request's bits"

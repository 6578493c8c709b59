"""Data-parallel rollout at the engine level (CPU): a batch dealt over 1, 2 or 4 engine replicas
(`workers.generate`, each prompt's group whole on one engine) gives every request the same tokens and
logprobs in the detent arm. Control: in the stock arm, 1 and 4 replicas differ — a replica decodes a
quarter of the rows, and the CPU's fp32 GEMM (the stock linear) rounds rows of a 24-row call other
than those of a 6-row one at this width (K = 896: measured M-invariant below 12 rows, not above).
The whole loop with replicas, in-process and as Ray actors, is tests/test_train.py's."""
from __future__ import annotations

import torch

from detent_rl.config import RolloutSection
from detent_rl.group import WorkerGroup
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.workers import GenerateRequest, ModelSpec, RolloutWorker, generate
from test_models import hf_model, save

WIDE = dict(hidden_size=896, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=14,
            num_key_value_heads=2)


def test_replicas_leave_each_request_its_bits_and_stock_does_not(tmp_path):
    path = save(hf_model("qwen2", **WIDE), tmp_path / "wide")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in torch.randint(5, 21, (24,), generator=g)]
    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=6) for i in range(24)]
    request = GenerateRequest(prompts, params)
    section = RolloutSection(prompts_per_step=8, samples_per_prompt=3, max_new_tokens=6, max_num_seqs=32,
                             cuda_graphs="off")
    runs = {}
    for arm in ("detent", "stock"):
        spec = ModelSpec(str(path), arm, "cpu", "bfloat16", max_context=64, max_batch=32, max_num_tokens=512)
        for n in (1, 2, 4):
            outs = generate(WorkerGroup(RolloutWorker, spec, section, size=n), request, group_size=3)
            runs[arm, n] = [(o.tokens, o.logprobs) for o in outs]
    assert all(t[:len(p)] == p for (t, _), p in zip(runs["detent", 1], prompts))  # back in request order
    assert runs["detent", 2] == runs["detent", 1] and runs["detent", 4] == runs["detent", 1]
    assert runs["stock", 4] != runs["stock", 1], "control: the stock rollout's bits should follow the split"

"""Data-parallel rollout at the engine level (CPU): a batch dealt over 1, 2 or 8 engine replicas
(`workers.generate`, each prompt's group whole on one engine) gives every request the same tokens and
logprobs in the detent arm. Control: in the stock arm, 1 and 8 replicas differ — a replica of the 8
decodes one group's 3 rows, and the CPU's fp32 GEMM (the stock linear) rounds the rows of a 3-row call
other than those of a 24-row one at this width (K = 896; the test checks that premise first). The
arms run fp32 because that is where this CPU's BLAS reads M: on the AVX2 EPYC of 2026-12 a bf16 linear
gave every row the same bits at every M, and fp32 split M <= 3 from M >= 6. (The earlier sessions'
machine split bf16 rows at 12, which the 4-replica bf16 control of before relied on.)
The whole loop with replicas, in-process and as Ray actors, is tests/test_train.py's."""
from __future__ import annotations

import torch

from detent_rl.config import RolloutSection
from detent_rl.group import WorkerGroup
from detent_rl.rollout.sequence import SamplingParams
from detent_rl.workers import GenerateRequest, ModelSpec, RolloutWorker, generate
from test_models import hf_model, save


def assert_cpu_gemm_reads_m(rows: int, batch: int) -> None:
    """The CPU stock controls' premise, checked on the machine they run on: the stock linear (fp32, K = 896)
    rounds the rows of a `rows`-row call otherwise than the same rows inside a `batch`-row call."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(1152, 896, generator=g), torch.randn(batch, 896, generator=g)
    assert not torch.equal(torch.nn.functional.linear(x[:rows], w), torch.nn.functional.linear(x, w)[:rows]), \
        f"this CPU's fp32 GEMM does not read M at {rows} rows: the stock control cannot fail here"


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
    assert_cpu_gemm_reads_m(3, 24)
    runs = {}
    for arm in ("detent", "stock"):
        spec = ModelSpec(str(path), arm, "cpu", "float32", max_context=64, max_batch=32, max_num_tokens=512)
        for n in (1, 2, 8):
            outs = generate(WorkerGroup(RolloutWorker, spec, section, size=n), request, group_size=3)
            runs[arm, n] = [(o.tokens, o.logprobs) for o in outs]
    assert all(t[:len(p)] == p for (t, _), p in zip(runs["detent", 1], prompts))  # back in request order
    assert runs["detent", 2] == runs["detent", 1] and runs["detent", 8] == runs["detent", 1]
    assert runs["stock", 8] != runs["stock", 1], "control: the stock rollout's bits should follow the split"

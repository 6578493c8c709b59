"""`rollout.backend: sglang` end to end on a GPU: SGLang's engine rolls a Qwen2 checkpoint out under
detent_rl's plugin, and the trainer's recomputation (`completion_logprobs(..., sglang=)`) gives back every
logprob, bit for bit, before and after a weight update; the trainer's own attention (control) does not.

Needs SGLang (0.5.23 or 0.5.17) with its CUDA kernels (`sgl_kernel`) — not only the Python package the
other SGLang tests use — so it skips where only the tests' stand-in for sgl_kernel is found. On a CUDA
machine with network:

    pip install "sglang==0.5.23" && pip install --no-deps -e .
    python -m pytest -m gpu tests/test_sglang_engine_gpu.py

On this project's H200 (torch 2.11, no network), 0.5.23's sglang-kernel does not load; the torch-2.11
stack (sglang 0.5.17, sglang-kernel 0.4.5 without FA3) travels in three parts instead:
`bench/sglang_engine_wheels.sh` (its header gives the calls). Passed there in session 26 (docs/BENCHMARKS.md).
The deployment's `max_num_tokens` covers the recomputation's one step of all 16 sequences (the selection
refuses a step past it before any kernel runs, as it did on the first try there).
"""
from __future__ import annotations

import os
import random
import warnings

import pytest
import torch

from sglang_env import STUBS, import_sglang

pytestmark = pytest.mark.gpu
sglang = import_sglang()
sgl_kernel = pytest.importorskip("sgl_kernel")
if os.path.dirname(os.path.abspath(sgl_kernel.__file__)).startswith(os.path.abspath(STUBS)):
    pytest.skip("SGLang's engine needs its CUDA kernels (sgl_kernel); only the tests' stand-in is here",
                allow_module_level=True)

from detent_rl.config import RolloutSection  # noqa: E402
from detent_rl.models.runner import completion_logprobs  # noqa: E402
from detent_rl.models.weights import weights_digest  # noqa: E402
from detent_rl.rollout.sequence import SamplingParams  # noqa: E402
from detent_rl.rollout.sglang_worker import SGLangRolloutWorker  # noqa: E402
from detent_rl.weight_sync import WeightUpdate  # noqa: E402
from detent_rl.workers import GenerateRequest, ModelSpec  # noqa: E402

TILE, CONTEXT = 256, 1024


def test_sglang_rollouts_are_recomputed_bit_for_bit(tmp_path):
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                                   torch_dtype="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    spec = ModelSpec(path=str(tmp_path), arm="detent", device="cuda", dtype="bfloat16", max_context=CONTEXT,
                     max_batch=32, max_num_tokens=16384, sglang_tile=TILE)
    worker = SGLangRolloutWorker(spec, RolloutSection(max_num_seqs=32, chunk_size=512), mem_fraction_static=0.3)
    model = spec.load()
    rng = random.Random(0)
    try:
        for step in range(2):
            prompts = [[rng.randrange(4096) for _ in range(rng.randint(20, 300))] for _ in range(4)] * 4
            params = [SamplingParams(seed=rng.randrange(2**62), temperature=1.0, max_tokens=rng.randint(8, 600))
                      for _ in prompts]
            done = worker.generate(GenerateRequest(prompts, params))
            seqs, temps = [(c.tokens, c.num_prompt) for c in done], [1.0] * len(done)
            with torch.no_grad():
                ours = completion_logprobs(model, seqs, temps, sglang=(TILE, CONTEXT))
                own = completion_logprobs(model, seqs, temps)
            rolled = [torch.tensor(c.logprobs, dtype=torch.float32) for c in done]
            assert all(torch.equal(a.cpu(), b) for a, b in zip(ours, rolled)), f"step {step}: SGLang's bits missed"
            assert not all(torch.equal(a.cpu(), b) for a, b in zip(own, rolled)), "control: our attention must differ"
            with torch.no_grad():  # a new policy: both sides take it
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            weights = {n: p.detach().clone() for n, p in model.named_parameters()}
            worker.update_weights(WeightUpdate(weights, weights_digest(weights)))
    finally:
        worker.shutdown()

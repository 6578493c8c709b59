"""`kernels.launch.launch`: our Triton kernels launched with the compiled kernel that Triton's own key finds,
without the rest of `JITFunction.run`'s per-launch work. It must launch the very variant `run` would, so a whole
RL step's work (generate with CUDA-graph decode, rescore, the trainer's forward with grad and its backward, each
arm) gives the same bits through either path, and the direct path must really be the one taken (Triton's `run`
counted: every launch of the second pass goes around it, while DETENT_LAUNCH=triton takes it for every launch)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from detent_rl.models import load_model
from detent_rl.models.runner import completion_logprobs
from detent_rl.rollout.engine import Engine
from detent_rl.rollout.sequence import SamplingParams
from test_models import LIMITS, hf_model, save, sequences

pytestmark = pytest.mark.gpu


def _step(model) -> tuple:
    """Generate (prefill, decode from graphs, the sampler), rescore, then a forward with grad and its backward:
    every kernel family of a step, forward and backward."""
    params = [SamplingParams(seed=s, temperature=1.0, max_tokens=6) for s in (1, 2, 3)]
    rolled = Engine(model, num_blocks=32).generate(sequences(5, (5, 18, 33)), params)
    batch = [(s.tokens, s.num_prompt) for s in rolled]
    with torch.inference_mode():
        rescored = [t.tolist() for t in completion_logprobs(model, batch, [1.0] * 3)]
    for p in model.parameters():
        p.requires_grad_(True)
        p.grad = None
    trained = completion_logprobs(model, batch, [1.0] * 3)
    torch.stack([x.sum() for x in trained]).sum().backward()
    grads = {n: p.grad.view(torch.int16 if p.dtype == torch.bfloat16 else torch.int32).cpu().clone()
             for n, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.requires_grad_(False)
        p.grad = None
    return [(s.completion, s.logprobs) for s in rolled], rescored, grads


@pytest.mark.parametrize("arm", ["detent", "stock"])
def test_gpu_direct_launches_give_the_bits_of_tritons_run(tmp_path, monkeypatch, arm):
    from triton.runtime.jit import JITFunction
    model = load_model(save(hf_model("qwen2"), tmp_path), arm, device="cuda", dtype=torch.bfloat16, **LIMITS)
    runs: Counter = Counter()
    real = JITFunction.run

    def counted(self, *args, **kwargs):
        if not kwargs.get("warmup"):
            runs[self._fn_name] += 1
        return real(self, *args, **kwargs)
    monkeypatch.setattr(JITFunction, "run", counted)
    monkeypatch.setenv("DETENT_LAUNCH", "triton")
    want = _step(model)  # Triton's own path; compiles every variant the step launches
    through_run = sum(runs.values())
    runs.clear()
    monkeypatch.delenv("DETENT_LAUNCH")
    got = _step(model)
    assert through_run > 100, f"only {through_run} launches through Triton's run: the step did not run our kernels"
    assert sum(runs.values()) == 0, f"launches that still took Triton's run: {dict(runs)}"
    assert got[0] == want[0] and got[1] == want[1]
    assert want[2] and got[2].keys() == want[2].keys()
    assert [n for n in want[2] if not torch.equal(got[2][n], want[2][n])] == []

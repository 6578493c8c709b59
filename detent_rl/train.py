"""GRPO with bit-exact rollout logprobs: `python -m detent_rl.train RECIPE [key.sub=value ...] [--resume]`.

Each step: generate (rollout actor) -> reward -> rescore + bit-check (trainer actor) -> advantages
-> train -> weight sync (sha256 checked on both sides) -> log -> checkpoint -> eval.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from detent_rl import checkpoint
from detent_rl.checkpoint import CheckpointCorrupt
from detent_rl.config import RecipeError, load_recipe, save_resolved
from detent_rl.data import DataError, PromptSampler
from detent_rl.models.config import ModelConfigError
from detent_rl.models.gguf import GGUFError, ModelFetchError
from detent_rl.models.loader import CheckpointError
from detent_rl.monitor import MismatchError, RunLog, bitcheck, dumps, enforce, truncate_jsonl
from detent_rl.report import write_report
from detent_rl.rewards import RewardError
from detent_rl.setup import get, prepare, sample_seed, start_workers
from detent_rl.tokenizer import TokenizerError
from detent_rl.trainer.grpo import group_advantages
from detent_rl.trainer.trainer import Sample


# bad input anywhere before the first step, and a bit mismatch under on_mismatch: raise: one line, exit 2
USER_ERRORS = (RecipeError, DataError, RewardError, TokenizerError, ModelConfigError, CheckpointError, GGUFError,
               ModelFetchError, CheckpointCorrupt, MismatchError)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.train", description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*", help="key.sub=value, e.g. train.steps=3 run.dir=/tmp/run")
    ap.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    args = ap.parse_intermixed_args(argv)  # overrides may come after --resume too
    try:
        return run(load_recipe(args.recipe, args.overrides), args.resume)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(recipe, resume: bool) -> int:
    run_dir, ro, steps = Path(recipe.run.dir), recipe.rollout, recipe.train.steps
    setup = prepare(recipe)
    save_resolved(recipe, run_dir)
    rollout, trainer = start_workers(recipe, setup)
    sampler = PromptSampler(setup.train_tasks, ro.prompts_per_step, recipe.run.seed)
    step, rng = 0, random.Random(recipe.run.seed)
    if resume:
        path = checkpoint.latest(run_dir)
        if path is None:
            print(f"error: --resume: {run_dir} has no checkpoint", file=sys.stderr)
            return 2
        step, state = checkpoint.load(path)
        get(recipe, trainer.load_state_dict.remote(state["trainer"]))
        sampler.load_state_dict(state["sampler"])
        rng.setstate(state["rng"])
    weights, sha = get(recipe, trainer.weights.remote())
    get(recipe, rollout.update_weights.remote(weights, sha))  # both sides start from the same bits
    truncate_jsonl(run_dir / "samples.jsonl", step)
    log = RunLog(run_dir, tensorboard=recipe.log.tensorboard, progress=recipe.log.progress, total_steps=steps,
                 start_step=step)
    stop = tuple(setup.tokenizer.eos_token_ids)
    while step < steps:
        step += 1
        t0 = time.perf_counter()
        tasks = sampler.next_batch()
        ids = [(t, j) for t in tasks for j in range(ro.samples_per_prompt)]
        params = [dict(seed=sample_seed(recipe.run.seed, step, t.id, j), temperature=ro.temperature, top_p=ro.top_p,
                       top_k=ro.top_k, max_tokens=ro.max_new_tokens, stop_token_ids=stop) for t, j in ids]
        outs = get(recipe, rollout.generate.remote([setup.prompts[t.id] for t, _ in ids], params))
        t_rollout = time.perf_counter() - t0
        samples = []
        for (t, j), p, o in zip(ids, params, outs):
            text = setup.tokenizer.decode(o["tokens"][o["num_prompt"]:])
            samples.append(Sample(f"{t.id}#{j}", o["tokens"], o["num_prompt"], o["logprobs"], ro.temperature,
                                  p["seed"], setup.reward(text, t), meta={"text": text}))
        advantages = group_advantages([s.reward for s in samples], ro.samples_per_prompt,
                                      std=recipe.train.loss.advantage_std)
        for s, a in zip(samples, advantages):
            s.advantage = a
        old = get(recipe, trainer.rescore.remote(samples))
        check = bitcheck(step, [s.request_id for s in samples],
                         [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in samples], old)
        log.bitcheck(check)
        enforce(check, recipe.run.on_mismatch)
        stats = get(recipe, trainer.train.remote(samples, old))
        # pi_trainer / pi_rollout per token: exactly 1 when the bits match (what TIS would correct)
        behaviour = torch.exp(torch.cat(old) - torch.cat([torch.tensor(s.rollout_logprobs) for s in samples]))
        weights, sha = get(recipe, trainer.weights.remote())
        get(recipe, rollout.update_weights.remote(weights, sha))
        new_tokens = sum(len(s.tokens) - s.num_prompt for s in samples)
        elapsed = time.perf_counter() - t0
        metrics = {"reward_mean": sum(s.reward for s in samples) / len(samples), "bit_match": check["bit_match"],
                   "kl_k1": check["kl_k1"], "kl_k3": check["kl_k3"], "max_abs_diff": check["max_abs_diff"],
                   "step_time_s": elapsed, "rollout_time_s": t_rollout, "tokens_per_s": new_tokens / t_rollout,
                   "new_tokens": new_tokens, "weights_sha256": sha, "rollout_ratio_min": behaviour.min().item(),
                   "rollout_ratio_max": behaviour.max().item(), "rollout_ratio_mean": behaviour.mean().item(), **stats}
        if recipe.eval.every and setup.eval_tasks and step % recipe.eval.every == 0:
            metrics["eval_reward"] = evaluate(rollout, setup, recipe, stop)
        log.metrics(step, metrics)
        with open(run_dir / "samples.jsonl", "a") as f:
            for s in samples:
                f.write(dumps({"step": step, "request_id": s.request_id, "seed": s.seed, "reward": s.reward,
                               "advantage": s.advantage, "completion": s.meta["text"]}) + "\n")
        if recipe.checkpoint.every and (step % recipe.checkpoint.every == 0 or step == steps):
            state = {"trainer": get(recipe, trainer.state_dict.remote()), "sampler": sampler.state_dict(),
                     "rng": rng.getstate()}
            checkpoint.save(run_dir, step, state, keep=recipe.checkpoint.keep)
    log.close()
    report = write_report(run_dir)
    print(json.dumps({"run_dir": str(run_dir), "steps": steps, "report": str(report)}))
    return 0


def evaluate(rollout, setup, recipe, stop) -> float:
    """Greedy completions of the held-out tasks; their mean reward."""
    tasks = setup.eval_tasks
    params = [dict(seed=0, temperature=0.0, max_tokens=recipe.rollout.max_new_tokens, stop_token_ids=stop)] * len(tasks)
    outs = get(recipe, rollout.generate.remote([setup.prompts[t.id] for t in tasks], params))
    texts = [setup.tokenizer.decode(o["tokens"][o["num_prompt"]:]) for o in outs]
    return sum(setup.reward(x, t) for x, t in zip(texts, tasks)) / len(tasks)


if __name__ == "__main__":
    sys.exit(main())

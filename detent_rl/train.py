"""GRPO with bit-exact rollout logprobs: `python -m detent_rl.train RECIPE [key.sub=value ...] [--resume [PATH]]`.

Each step: generate (rollout group) -> reward -> advantages -> rescore + bit-check -> train (trainer
group) -> weight sync (trainer -> rollout directly, a digest checked on both sides) -> log -> checkpoint
-> eval. With one update per batch (`train.free_bitcheck`, the default) there is no rescore pass: the
update's own forward runs on the rollout's weights, its logprobs are checked, and a mismatch stops the
run before the updated weights leave the trainer. With more updates per batch a rescore pass gives
logp_old and checks every token, or (`train.old_logprobs: rollout`) the rollout's logprobs are logp_old
and the first minibatch's update forward is checked. A run that stops on a mismatch still writes its
report.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch

from detent_rl import atomic, checkpoint
from detent_rl.bitcheck import MismatchError, bitcheck, enforce
from detent_rl.checkpoint import CheckpointError
from detent_rl.config import Recipe, RecipeError, load_recipe, save_resolved
from detent_rl.data import DataError, PromptSampler, Task
from detent_rl.group import WorkerDiedError, WorkerGroup, gather
from detent_rl.models.config import ModelConfigError
from detent_rl.models.gguf import GGUFError, ModelFetchError
from detent_rl.models.loader import WeightsError
from detent_rl.report import COMMITMENT_FILE, write_report
from detent_rl.rewards import RewardError
from detent_rl.rollout.sequence import SamplingParams, sample_seed
from detent_rl.runlog import RunLog
from detent_rl.selir.errors import SelIRError
from detent_rl.setup import RunSetup, prepare, rollout_tp, start_workers
from detent_rl.tokenizer import TokenizerError
from detent_rl.trainer.grpo import group_advantages
from detent_rl.trainer.trainer import Sample
from detent_rl.workers import GenerateRequest, generate

# bad input anywhere before the first step, and a bit mismatch under on_mismatch: raise: one line, exit 2
USER_ERRORS = (RecipeError, DataError, RewardError, TokenizerError, ModelConfigError, WeightsError, GGUFError,
               ModelFetchError, CheckpointError, SelIRError, MismatchError)
OVERRIDE = re.compile(r"[A-Za-z_][\w.]*=.*")



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.train", description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*", help="key.sub=value, e.g. train.steps=3 run.dir=/tmp/run")
    ap.add_argument("--resume", nargs="?", const="", default=None, metavar="PATH",
                    help="continue from the run directory's newest checkpoint, or from the checkpoint at PATH")
    args = ap.parse_intermixed_args(argv)  # overrides may come after --resume too
    if args.resume and OVERRIDE.fullmatch(args.resume) and not Path(args.resume).exists():
        args.overrides, args.resume = [args.resume, *args.overrides], ""  # `--resume key=value`: not a path
    try:
        return run(load_recipe(args.recipe, args.overrides), args.resume)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WorkerDiedError as e:  # the run stops; its checkpoints stand
        print(f"error: {e}", file=sys.stderr)
        return 3


def run(recipe: Recipe, resume: Optional[str] = None) -> int:
    """The run; `resume` is None (start fresh), "" (the run directory's newest checkpoint) or a path."""
    run_dir, steps = Path(recipe.run.dir), recipe.train.steps
    start = checkpoint.resume_point(resume or run_dir) if resume is not None else None  # before any worker
    setup = prepare(recipe)
    save_resolved(recipe, run_dir)
    rollout, trainer = start_workers(recipe, setup)
    try:
        start_trainer_ranks(recipe, trainer)
        start_tp_groups(recipe, rollout, trainer)
        record_workers(run_dir, rollout, trainer)
        sampler = PromptSampler(setup.train_tasks, recipe.rollout.prompts_per_step, recipe.run.seed)
        step = 0
        if start is not None:
            step = checkpoint.step_of(start)
            lead(trainer, "load_state", start / checkpoint.TRAINER_PART)
            sampler.load_state_dict(checkpoint.load_part(start, checkpoint.DRIVER_PART)["sampler"])
        transport = sync_transport(recipe, rollout, trainer)  # the workers' placement: fixed for the run
        sync_weights(rollout, trainer, transport, recipe.model.tp_size)  # both sides start from the same bits
        if recipe.run.arm != "stock":  # stock pins nothing: its selectors read the batch
            record_commitment(run_dir, rollout, trainer, rollout_tp(recipe) == recipe.model.tp_size)
        with RunLog(run_dir, tensorboard=recipe.log.tensorboard, progress=recipe.log.progress, total_steps=steps,
                    start_step=step) as log:
            try:
                while step < steps:
                    step += 1
                    metrics = train_step(recipe, setup, rollout, trainer, sampler.next_batch(), step, log, transport)
                    try:  # the step's line is written even if its checkpoint fails
                        if recipe.checkpoint.every and (step % recipe.checkpoint.every == 0 or step == steps):
                            t_save = time.perf_counter()
                            save_checkpoint(run_dir, step, trainer, sampler, recipe.checkpoint.keep)
                            metrics["checkpoint_time_s"] = time.perf_counter() - t_save
                    finally:
                        log.metrics(step, metrics)
            except MismatchError as e:
                log.close()
                raise MismatchError(f"{e}; report: {write_report(run_dir)}", e.record) from None
            except WorkerDiedError as e:
                log.close()
                newest = checkpoint.latest(run_dir)
                raise WorkerDiedError(f"step {step}: {e}; " + (f"resume from {newest} with --resume" if newest else
                                      "no checkpoint to resume from (checkpoint.every is 0 or none was due)")) from None
    finally:
        if recipe.ray.mode == "ray":
            import ray
            ray.shutdown()  # ends the actors; a Ray this process started goes with them
    report = write_report(run_dir)
    print(json.dumps({"run_dir": str(run_dir), "steps": steps, "report": str(report)}))
    return 0


def lead(trainer: WorkerGroup, method: str, *args):
    """`method` on every trainer rank (a ZeRO group's ranks each do their part, collectives included);
    rank 0's result, which every rank's equals."""
    return trainer.call(method, *args)[0]


def rank0(trainer: WorkerGroup, method: str, *args) -> list:
    """`method` started on the trainer's rank 0 alone (what holds the weights the engines take); its handle."""
    return trainer.async_each(method, [args] + [None] * (len(trainer) - 1))


def start_groups(group: WorkerGroup, method: str, size: int) -> list:
    """`method(address, rank, size)` on every worker of `group`, whose consecutive runs of `size` workers
    each form a torch.distributed group at the address of its first (rank 0); the handles."""
    addresses = group.get(group.async_each("sync_address", [() if j % size == 0 else None
                                                            for j in range(len(group))]))
    return group.async_each(method, [(addresses[j // size], j % size, size) for j in range(len(group))])


def start_trainer_ranks(recipe: Recipe, trainer: WorkerGroup) -> None:
    """With `train.zero_stage`: the ranks' torch.distributed group at rank 0's address, then DeepSpeed."""
    if recipe.train.zero_stage is not None:
        trainer.get(start_groups(trainer, "start_zero", len(trainer)))


def start_tp_groups(recipe: Recipe, rollout: WorkerGroup, trainer: WorkerGroup) -> None:
    """With tensor parallelism (`model.tp_size`, `rollout.tp_size`): each engine's ranks and the trainer's
    ranks form their group (at the group's rank 0's address), then each rank loads its part of the model;
    all at once."""
    calls = [(group, start_groups(group, "start_tp", size))
             for group, size in ((rollout, rollout_tp(recipe)), (trainer, recipe.model.tp_size)) if size > 1]
    if calls:
        gather(*calls)


def sync_transport(recipe: Recipe, rollout: WorkerGroup, trainer: WorkerGroup) -> str:
    """How the weights travel (`ray.weight_sync`; auto: the fastest the placement allows): in one process
    the engine takes the trainer's device tensors ("device"); Ray actors on one GPU (the same device
    UUID) pass CUDA IPC handles ("ipc"), and the engine copies device to device; on other GPUs a
    broadcast from the trainer ("collective", NCCL); on the CPU host copies through Ray ("host").
    A collective's group is formed here, once for the run. With tensor parallelism each trainer rank r
    sends its part to rank r of every engine, by the same rules applied rank by rank (a broadcast group
    per rank: trainer rank r and every engine's rank r)."""
    if recipe.ray.mode == "inline":
        return "device"
    tp = recipe.model.tp_size
    if rollout_tp(recipe) != tp:  # weights cut another way on each side: `RolloutWorker.reshard_weights`
        if recipe.ray.weight_sync not in ("auto", "host"):
            raise RecipeError(f"{recipe.source}: ray.weight_sync: {recipe.ray.weight_sync}: the engines' and the "
                              f"trainer's tensor-parallel degrees differ, and their weights are recut from host "
                              f"copies; use auto or host")
        return "reshard"
    mine, theirs = trainer.call("device_uuid"), rollout.call("device_uuid")
    peers = [mine[j % tp] if tp > 1 else mine[0] for j in range(len(theirs))]  # each engine worker's sender
    shared = None not in peers and all(u == p for u, p in zip(theirs, peers))
    # a broadcast group: every rank on its own GPU (NCCL), or all on the CPU (gloo)
    senders = mine if tp > 1 else mine[:1]
    distinct = None not in (*senders, *theirs) and len({*senders, *theirs}) == len(theirs) + len(senders)
    on_cpu = all(u is None for u in (*senders, *theirs))
    transport = recipe.ray.weight_sync
    if transport == "auto":
        transport = "ipc" if shared else "collective" if distinct else "host"
    if transport == "ipc" and not shared:
        raise RecipeError(f"{recipe.source}: ray.weight_sync: ipc needs each engine on its trainer rank's GPU")
    if transport == "collective" and not (distinct or on_cpu):
        raise RecipeError(f"{recipe.source}: ray.weight_sync: collective needs every engine and the trainer on a "
                          f"GPU of its own, or all on the CPU")
    if transport == "collective":  # per TP rank r: the trainer's rank r (the sender) and every engine's rank r
        engines = len(rollout) // tp
        addresses = trainer.get(trainer.async_each("sync_address", [() for _ in range(tp)] +
                                                   [None] * (len(trainer) - tp)))
        handles = trainer.async_each("join_sync_group", [(addresses[r], 0, engines + 1) for r in range(tp)] +
                                     [None] * (len(trainer) - tp))
        joined = rollout.async_each("join_sync_group", [(addresses[j % tp], j // tp + 1, engines + 1)
                                                        for j in range(len(rollout))])
        gather((trainer, handles), (rollout, joined))
    return transport


def sync_weights(rollout: WorkerGroup, trainer: WorkerGroup, transport: str, tp: int = 1) -> str:
    """The trainer's compute weights into every engine, checked there by digest (`RolloutWorker.
    update_weights`); the digest's hex (with `tp` ranks, each rank's part's, joined by commas).
    `transport`: `sync_transport`'s choice. A collective sync sends the manifest (names, shapes,
    digest) first, then the broadcast, which both sides enter at once."""
    senders = tp if tp > 1 else 1  # trainer ranks that hold weights to send (a ZeRO group's rank 0 alone)
    others = [None] * (len(trainer) - senders)
    if transport == "reshard":  # every trainer rank's part to every engine worker, recut there
        parts = trainer.async_each("weights", [("host",)] * senders + others)
        (digest,) = set(rollout.get(rollout.async_each("reshard_weights", [(senders, *parts)] * len(rollout))))
        return digest
    if transport == "collective":
        manifests = trainer.get(trainer.async_each("weights_manifest", [()] * senders + others))
        sending = trainer.async_each("broadcast_weights", [()] * senders + others)
        received = rollout.async_each("receive_weights", [(manifests[j % senders],) for j in range(len(rollout))])
        _, digests = gather((trainer, sending), (rollout, received))  # a dead engine reported at once
    else:
        parts = trainer.async_each("weights", [(transport,)] * senders + others)
        digests = rollout.get(rollout.async_each("update_weights", [(parts[j % senders],)
                                                                    for j in range(len(rollout))]))
    by_rank = [sorted(set(digests[r::senders])) for r in range(senders)]
    if any(len(d) != 1 for d in by_rank):
        raise RuntimeError(f"weight sync: engines hold different weights after the sync: {by_rank}")
    return ",".join(d[0] for d in by_rank)


def train_step(recipe: Recipe, setup: RunSetup, rollout: WorkerGroup, trainer: WorkerGroup, tasks: list[Task],
               step: int, log: RunLog, transport: str) -> dict:
    """One step; its metrics, for the caller to log once the step's checkpoint (if due) is timed too."""
    ro = recipe.rollout
    t0 = time.perf_counter()
    ids = [(t, j) for t in tasks for j in range(ro.samples_per_prompt)]
    params = [SamplingParams(seed=sample_seed(recipe.run.seed, step, t.id, j), temperature=ro.temperature,
                             top_p=ro.top_p, top_k=ro.top_k, max_tokens=ro.max_new_tokens,
                             stop_token_ids=tuple(setup.tokenizer.eos_token_ids)) for t, j in ids]
    outs = generate(rollout, GenerateRequest([setup.prompts[t.id] for t, _ in ids], params), ro.samples_per_prompt,
                    rollout_tp(recipe))
    if ro.release_memory:  # the trainer's update gets the engines' KV cache; the next generate takes it back
        rollout.call("release_memory")
    t_rollout = time.perf_counter() - t0
    t_reward = time.perf_counter()
    samples = []
    for (t, j), p, o in zip(ids, params, outs):
        text = setup.tokenizer.decode(o.tokens[o.num_prompt:])
        samples.append(Sample(f"{t.id}#{j}", o.tokens, o.num_prompt, o.logprobs, ro.temperature, p.seed,
                              setup.reward(text, t), meta={"text": text}))
    advantages = group_advantages([s.reward for s in samples], ro.samples_per_prompt,
                                  std=recipe.train.loss.advantage_std)
    for s, a in zip(samples, advantages):
        s.advantage = a
    t_reward = time.perf_counter() - t_reward
    rollout_lp = [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in samples]
    free = recipe.train.free_bitcheck and recipe.train.updates_per_batch == 1
    rollout_old = recipe.train.updates_per_batch > 1 and recipe.train.old_logprobs == "rollout"
    t_train, t_rescore = time.perf_counter(), 0.0
    if free:  # the update's own forward is the trainer's side; a mismatch stops before the weights leave it
        stats, old = lead(trainer, "train_checked", samples)
        source = "update"
    elif rollout_old:  # no rescore: the first minibatch's update forward is checked (its samples only)
        stats, old = lead(trainer, "train_rollout_old", samples)
        source = "first minibatch's update"
    else:
        if recipe.model.tp_size > 1:  # every tensor-parallel rank computes its part of the forward
            old = lead(trainer, "rescore", samples)
        else:
            (old,) = trainer.get(rank0(trainer, "rescore", samples))  # no grad, no collective: one rank is enough
        t_rescore = time.perf_counter() - t_train
        source = "rescore"
    checked = len(old)
    check = bitcheck(step, [s.request_id for s in samples[:checked]], rollout_lp[:checked], old)
    log.bitcheck(check)
    enforce(check, recipe.run.on_mismatch)
    if not free and not rollout_old:
        stats = lead(trainer, "train", samples, old)
    t_train = time.perf_counter() - t_train - t_rescore
    # pi_trainer / pi_rollout per token: exactly 1 when the bits match (what TIS would correct)
    behaviour = torch.exp(torch.cat(old) - torch.cat(rollout_lp[:checked]))
    t_sync = time.perf_counter()
    digest = sync_weights(rollout, trainer, transport, recipe.model.tp_size)
    t_sync = time.perf_counter() - t_sync
    new_tokens = sum(len(s.tokens) - s.num_prompt for s in samples)
    metrics = {"reward_mean": sum(s.reward for s in samples) / len(samples), "bit_match": check["bit_match"],
               "kl_k1": check["kl_k1"], "kl_k3": check["kl_k3"], "max_abs_diff": check["max_abs_diff"],
               "step_time_s": time.perf_counter() - t0, "rollout_time_s": t_rollout,
               "tokens_per_s": new_tokens / t_rollout, "new_tokens": new_tokens, "weights_digest": digest,
               "weight_sync_s": t_sync, "weight_sync": transport, "reward_time_s": t_reward,
               "rescore_time_s": t_rescore,
               "train_time_s": t_train,
               "rollout_ratio_min": behaviour.min().item(), "rollout_ratio_max": behaviour.max().item(),
               "rollout_ratio_mean": behaviour.mean().item(), "bitcheck_source": source,
               "bitcheck_samples": checked,
               **asdict(stats)}
    if recipe.eval.every and setup.eval_tasks and step % recipe.eval.every == 0:
        metrics["eval_reward"] = evaluate(recipe, setup, rollout)
    log.samples(step, [{"request_id": s.request_id, "seed": s.seed, "reward": s.reward, "advantage": s.advantage,
                        "completion": s.meta["text"]} for s in samples])
    return metrics


def evaluate(recipe: Recipe, setup: RunSetup, rollout: WorkerGroup) -> float:
    """Greedy completions of the held-out tasks; their mean reward."""
    tasks = setup.eval_tasks
    greedy = SamplingParams(seed=0, temperature=0.0, max_tokens=recipe.rollout.max_new_tokens,
                            stop_token_ids=tuple(setup.tokenizer.eos_token_ids))
    outs = generate(rollout, GenerateRequest([setup.prompts[t.id] for t in tasks], [greedy] * len(tasks)),
                    tp_size=rollout_tp(recipe))
    texts = [setup.tokenizer.decode(o.tokens[o.num_prompt:]) for o in outs]
    return sum(setup.reward(x, t) for x, t in zip(texts, tasks)) / len(tasks)


def record_workers(run_dir: Path, rollout: WorkerGroup, trainer: WorkerGroup) -> None:
    """workers.json in the run directory: each worker's process id (the driver's own when inline), by group
    and rank, for whoever watches or stops the run's processes; under Ray, the placement group's bundles
    and, per worker, the group it runs in (as it reports it) and its bundle."""
    record: dict[str, Any] = {"rollout": rollout.call("pid"), "trainer": trainer.call("pid")}
    if rollout.is_ray and rollout.placement.placement_group is not None:
        import ray
        pg = rollout.placement.placement_group
        record["placement"] = {
            "bundles": [ray.util.placement_group_table(pg)["bundles"][i] for i in range(pg.bundle_count)],
            **{name: [{"placement_group": g, "bundle": b, "of": pg.id.hex()}
                      for g, b in zip(group.call("placement_group"), group.placement.bundles)]
               for name, group in (("rollout", rollout), ("trainer", trainer))}}
    atomic.write_text(run_dir / "workers.json", json.dumps(record) + "\n")


TRAINER_COMMITMENT_FILE = "commitment_trainer.json"  # when the trainer's tensor-parallel degree is another


def record_commitment(run_dir: Path, rollout: WorkerGroup, trainer: WorkerGroup, same_degree: bool = True) -> None:
    """Writes the resolved commitment tuple (every call site, defaults included) to the run directory;
    every worker of both groups must run the same one. With `same_degree` False (`model.tp_invariant`,
    engines and trainer cut over different numbers of ranks) each group runs its own tuple of the pair,
    and the trainer's is written beside the engines' as TRAINER_COMMITMENT_FILE."""
    (rolled, *others), (trained, *ranks) = rollout.call("commitment"), trainer.call("commitment")
    groups = [(rolled, others + ([] if not same_degree else [trained, *ranks]))]
    if not same_degree:
        groups.append((trained, ranks))
    for first, rest in groups:
        for other in rest:
            if other.sha256() != first.sha256():
                raise SelIRError(f"the rollout and trainer workers resolved different commitment tuples "
                                 f"({first.sha256()[:12]} vs {other.sha256()[:12]}): their deployments differ")
    rolled.save(run_dir / COMMITMENT_FILE)
    if not same_degree:
        trained.save(run_dir / TRAINER_COMMITMENT_FILE)


def save_checkpoint(run_dir: Path, step: int, trainer: WorkerGroup, sampler: PromptSampler, keep: int) -> None:
    """The trainer writes its own part (streamed from its tensors), the driver its sampler; then publish."""
    staged = checkpoint.stage(run_dir, step)
    lead(trainer, "save_state", staged / checkpoint.TRAINER_PART)
    checkpoint.save_part(staged, checkpoint.DRIVER_PART, {"sampler": sampler.state_dict()})
    checkpoint.publish(run_dir, step, staged, keep=keep)


if __name__ == "__main__":
    sys.exit(main())

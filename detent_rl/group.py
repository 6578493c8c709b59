"""Worker groups: N copies of one worker class, called the same way whether they are Ray actors or
plain objects in the driver's process (`ray.mode: inline`).

    rollout = WorkerGroup(RolloutWorker, spec, recipe.rollout, ray=ray_options)   # or ray=None: inline
    handles = rollout.async_call("generate", request)   # Ray refs, or the results themselves inline
    results = rollout.get(handles)                      # one result per worker, in worker order
    parts = rollout.get(rollout.async_each("generate", [(a,), (b,)]))   # each worker its own arguments

A handle may be passed as an argument to another group's call: Ray then moves the value from the
worker that made it straight to the workers that take it (the driver never holds it), which is how
weights go from the trainer group to the rollout group. Inline, the handle is the value itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Optional, TypeVar

W = TypeVar("W")


class WorkerDiedError(RuntimeError):
    """A worker's process ended (Ray reports its actor dead) while the driver waited on it."""


@dataclass(frozen=True)
class RayPlacement:
    """Resources of each Ray actor of a group; with `placement_group`, worker i is placed in its bundle
    `bundles[i]` (its resources come out of that bundle's reservation)."""
    num_cpus: float = 1
    num_gpus: float = 0
    placement_group: Any = None
    bundles: tuple[int, ...] = ()


class WorkerGroup(Generic[W]):
    """`size` workers built as `cls(*args, **kwargs)`: Ray actors with `ray` placement, else in-process."""

    def __init__(self, cls: type[W], *args: Any, size: int = 1, ray: Optional[RayPlacement] = None,
                 **kwargs: Any) -> None:
        if size < 1:
            raise ValueError(f"a worker group needs at least one worker, got size {size}")
        self.name = cls.__name__
        self.is_ray = ray is not None
        self.placement = ray
        if self.is_ray:
            import ray as ray_
            actor = ray_.remote(cls)
            if ray.placement_group is not None and len(ray.bundles) != size:
                raise ValueError(f"{self.name} group of {size} workers given {len(ray.bundles)} bundles")
            self._workers = [actor.options(num_cpus=ray.num_cpus, num_gpus=ray.num_gpus,
                                           **_in_bundle(ray, i)).remote(*args, **kwargs) for i in range(size)]
        else:
            self._workers = [cls(*args, **kwargs) for _ in range(size)]

    def __len__(self) -> int:
        return len(self._workers)

    def async_call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start `method` on every worker; one handle per worker (a Ray ref, or inline the result)."""
        if self.is_ray:
            return [getattr(w, method).remote(*args, **kwargs) for w in self._workers]
        return [getattr(w, method)(*args, **kwargs) for w in self._workers]

    def async_each(self, method: str, calls: list[Optional[tuple]]) -> list[Any]:
        """Start `method` on worker i with the arguments calls[i] (None: that worker is not called); one
        handle per call made, in worker order."""
        if len(calls) != len(self._workers):
            raise ValueError(f"{self.name} group has {len(self._workers)} workers; got {len(calls)} argument tuples")
        workers = [(w, args) for w, args in zip(self._workers, calls) if args is not None]
        if self.is_ray:
            return [getattr(w, method).remote(*args) for w, args in workers]
        return [getattr(w, method)(*args) for w, args in workers]

    def get(self, handles: list[Any]) -> list[Any]:
        """The handles' results, in order. A Ray actor that died meanwhile: WorkerDiedError naming it."""
        return gather((self, handles))[0]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` on every worker, waited for: one result per worker."""
        return self.get(self.async_call(method, *args, **kwargs))

    def call_one(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` on a group of one worker, waited for: its result."""
        if len(self._workers) != 1:
            raise ValueError(f"{self.name} group has {len(self._workers)} workers; call_one needs exactly one")
        return self.call(method, *args, **kwargs)[0]


def gather(*calls: tuple["WorkerGroup", list[Any]]) -> list[list[Any]]:
    """The results of handles started together on several groups (one list per group, in order). Under
    Ray they are awaited as they finish, so a worker that dies is reported at once — not after a peer
    that waits for it (in a collective) has timed out — and any failure while some worker of these
    groups is dead is reported as that death (WorkerDiedError naming the group and worker), the cause
    behind a peer's broken connection."""
    if not any(group.is_ray for group, _ in calls):
        return [list(handles) for _, handles in calls]
    import ray as ray_
    pending = [ref for group, handles in calls if group.is_ray for ref in handles]
    try:
        while pending:
            ready, pending = ray_.wait(pending, num_returns=1)
            ray_.get(ready)
    except Exception as e:  # noqa: BLE001 - re-raised as the death behind it, or as it was
        dead = [(group, i) for group, _ in calls if group.is_ray for i, w in enumerate(group._workers)
                if _dead(ray_, w)]
        if dead:
            names = ", ".join(f"{group.name} worker {i} of {len(group)}" for group, i in dead)
            raise WorkerDiedError(f"{names} died: {str(e).strip().splitlines()[0]}") from e
        raise
    return [ray_.get(handles) if group.is_ray else list(handles) for group, handles in calls]


def _in_bundle(ray: RayPlacement, i: int) -> dict:
    """The actor options that put worker i in its bundle of the placement group (none without one)."""
    if ray.placement_group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        ray.placement_group, placement_group_bundle_index=ray.bundles[i])}


def _dead(ray_: Any, actor: Any) -> bool:
    """Whether a Ray actor is dead: its built-in readiness call fails as an actor error. A live actor busy
    with a long task may not answer in time: that is no death."""
    try:
        ray_.get(actor.__ray_ready__.remote(), timeout=10)
    except ray_.exceptions.RayActorError:
        return True
    except ray_.exceptions.GetTimeoutError:
        pass
    return False

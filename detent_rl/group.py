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
    """Resources of each Ray actor of a group."""
    num_cpus: float = 1
    num_gpus: float = 0


class WorkerGroup(Generic[W]):
    """`size` workers built as `cls(*args, **kwargs)`: Ray actors with `ray` placement, else in-process."""

    def __init__(self, cls: type[W], *args: Any, size: int = 1, ray: Optional[RayPlacement] = None,
                 **kwargs: Any) -> None:
        if size < 1:
            raise ValueError(f"a worker group needs at least one worker, got size {size}")
        self.name = cls.__name__
        self.is_ray = ray is not None
        if self.is_ray:
            import ray as ray_
            actor = ray_.remote(cls).options(num_cpus=ray.num_cpus, num_gpus=ray.num_gpus)
            self._workers = [actor.remote(*args, **kwargs) for _ in range(size)]
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
        if not self.is_ray:
            return list(handles)
        import ray as ray_
        try:
            return ray_.get(handles)
        except ray_.exceptions.RayActorError as e:
            dead = [i for i, w in enumerate(self._workers) if _dead(ray_, w)]
            which = f"worker {', '.join(map(str, dead))}" if dead else "a worker"
            raise WorkerDiedError(f"{self.name} {which} of {len(self._workers)} died: "
                                  f"{str(e).strip().splitlines()[0]}") from e

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method` on every worker, waited for: one result per worker."""
        return self.get(self.async_call(method, *args, **kwargs))

    def call_one(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` on a group of one worker, waited for: its result."""
        if len(self._workers) != 1:
            raise ValueError(f"{self.name} group has {len(self._workers)} workers; call_one needs exactly one")
        return self.call(method, *args, **kwargs)[0]


def _dead(ray_: Any, actor: Any) -> bool:
    """Whether a Ray actor is dead (a cheap call it cannot answer)."""
    try:
        ray_.get(actor.__ray_ready__.remote(), timeout=10)
        return False
    except Exception:  # noqa: BLE001 - any failure to answer means it cannot serve the run
        return True

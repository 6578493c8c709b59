"""The commitment tuple: the pins and knobs of every kernel call site of one deployment, as a value.

A tuple is an input. Nothing writes into one: `KernelSelections` keeps the values it resolved (the
solver's defaults for sites the tuple leaves out) in its own state and hands them out as a new tuple
(`KernelSelections.resolved()`); the tuner builds a new tuple from that one (`with_sites`). The
file is JSON:

    {"deployment": {"num_heads": 14, ..., "max_num_tokens": 8192, ...},     # asdict(Deployment)
     "sites": {"matmul[k=4864][n=896]": {"pins": {"chunk": 640}, "knobs": {"schedule_by_m": true}}, ...}}

The recorded deployment is what the pins were chosen for; loading the tuple into a model of another
deployment is refused, naming each differing fact, and so is a tuple that records none. `sha256()`
hashes the canonical JSON (sorted keys, no spaces), so a tuple and its saved-and-loaded copy have one
hash whatever the file's formatting.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional

from detent_rl.atomic import write_text
from detent_rl.selir.errors import SelIRError

MAKE_ONE = "python -m detent_rl.tune --recipe RECIPE --out FILE"


class CommitmentError(SelIRError):
    """A commitment tuple that cannot be used as given: unreadable, made for another deployment or
    other call sites, recording no deployment, or given to an arm that would ignore it."""


def _plain(value: Any, what: str) -> Any:
    """`value` as JSON reads it back (tuples become lists), so a tuple built in memory equals its file."""
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise CommitmentError(f"{what}: not a JSON value ({e})") from e


def _frozen(mapping: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        raise CommitmentError(f"{what}: expected an object, got {type(mapping).__name__}")
    return MappingProxyType(_plain(dict(mapping), what))


@dataclass(frozen=True)
class SiteCommitment:
    """One call site's committed values: its pins (the cut's values) and its knobs, read-only."""
    pins: Mapping[str, Any] = field(default_factory=dict)
    knobs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pins", _frozen(self.pins, "pins"))
        object.__setattr__(self, "knobs", _frozen(self.knobs, "knobs"))

    def to_json(self) -> dict:
        return {"pins": dict(self.pins), "knobs": dict(self.knobs)}

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_json(), sort_keys=True))

    def __reduce__(self):  # read-only mappings do not pickle; the plain values do
        return SiteCommitment, (dict(self.pins), dict(self.knobs))


@dataclass(frozen=True)
class CommitmentTuple:
    """Pins and knobs per call site (`sites`, keyed like `"matmul[k=896][n=1152]"`), and the
    deployment (`dataclasses.asdict(Deployment)`) they were chosen for. Immutable; `source` (the
    file it was loaded from, for messages) takes no part in equality or the hash."""
    sites: Mapping[str, SiteCommitment] = field(default_factory=dict)
    deployment: Optional[Mapping[str, Any]] = None
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.sites, Mapping):
            raise CommitmentError(f"{self.label()}: 'sites' must be an object, got {type(self.sites).__name__}")
        sites = {}
        for key, entry in self.sites.items():
            if not isinstance(entry, SiteCommitment):
                if not isinstance(entry, Mapping):
                    raise CommitmentError(f"{self.label()}: sites.{key} must be an object with 'pins' and 'knobs'")
                extra = sorted(set(entry) - {"pins", "knobs"})
                if extra:
                    raise CommitmentError(f"{self.label()}: sites.{key} has unknown keys {extra}")
                try:
                    entry = SiteCommitment(entry.get("pins", {}), entry.get("knobs", {}))
                except CommitmentError as e:
                    raise CommitmentError(f"{self.label()}: sites.{key}.{e}") from None
            sites[str(key)] = entry
        object.__setattr__(self, "sites", MappingProxyType(dict(sorted(sites.items()))))
        if self.deployment is not None:
            object.__setattr__(self, "deployment", _frozen(self.deployment, f"{self.label()}: deployment"))

    def label(self) -> str:
        """"commitment tuple PATH" (or without the path for one built in memory): how messages name it."""
        return f"commitment tuple {self.source}" if self.source else "commitment tuple"

    # ---- the value ----------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"deployment": None if self.deployment is None else dict(self.deployment),
                "sites": {key: entry.to_json() for key, entry in self.sites.items()}}

    def canonical_json(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        """Hex sha256 of `canonical_json()`: equal tuples have equal hashes, whatever the file looks like."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def __reduce__(self):
        return CommitmentTuple, (self.to_json()["sites"], self.to_json()["deployment"], self.source)

    def with_sites(self, sites: Mapping[str, SiteCommitment | Mapping]) -> "CommitmentTuple":
        """A new tuple: this one with `sites`' entries added or replaced (this one is unchanged)."""
        return CommitmentTuple({**self.sites, **sites}, self.deployment)

    # ---- files --------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: os.PathLike | str) -> "CommitmentTuple":
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CommitmentError(f"commitment tuple {p}: cannot be read ({e})") from e
        if not isinstance(data, dict) or not isinstance(data.get("sites"), dict):
            raise CommitmentError(f"commitment tuple {p}: expected an object with a 'sites' object")
        extra = sorted(set(data) - {"deployment", "sites"})
        if extra:
            raise CommitmentError(f"commitment tuple {p}: unknown keys {extra}")
        return cls(data["sites"], data.get("deployment"), str(p))

    def save(self, path: os.PathLike | str) -> Path:
        """Write the tuple as indented JSON, atomically (`detent_rl.atomic.write_text`)."""
        return write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    # ---- checks -------------------------------------------------------------------------------
    def check_deployment(self, deployment: Mapping[str, Any], later: Optional[Mapping[str, Any]] = None) -> None:
        """Refuse (CommitmentError, one line) unless the recorded deployment equals `deployment`
        (a model's `dataclasses.asdict(Deployment)`); each differing fact is named. `later`: facts added
        after some tuples were recorded, with the value a tuple that lacks one was made for."""
        if dataclasses.is_dataclass(deployment):
            deployment = dataclasses.asdict(deployment)
        if self.deployment is None:
            raise CommitmentError(f"{self.label()} records no deployment, so nothing shows its pins were chosen "
                                  f"for this model; make one with `{MAKE_ONE}`")
        absent = "(absent)"
        recorded = {**(later or {}), **self.deployment}
        names = [*deployment, *(k for k in recorded if k not in deployment)]
        wrong = [f"{k}: tuple {recorded.get(k, absent)}, model {deployment.get(k, absent)}"
                 for k in names if recorded.get(k, absent) != deployment.get(k, absent)]
        if wrong:
            raise CommitmentError(f"{self.label()} was made for another deployment: {'; '.join(wrong)} "
                                  f"(make one for this deployment with `{MAKE_ONE}`)")


def listed(keys: Iterable[str], limit: int = 8) -> str:
    """`[a, b, ...] (+N more)`: a one-line list of site keys."""
    keys = list(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return "[" + ", ".join(keys[:limit]) + ("" if len(keys) <= limit else ", ...") + "]" + more

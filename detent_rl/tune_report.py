"""The tuner's report (`python -m detent_rl.tune`): per site what the search measured and kept, and the workload
before and after, predicted and measured (the paper's additivity check)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from detent_rl.tune_search import MIN_GAIN


@dataclass
class SiteReport:
    key: str
    family: str
    grid: int  # legal assignments
    measured: int
    calls: int  # recorded launches (sum of counts)
    default: tuple
    best: tuple
    default_s: float  # the site's replayed time per workload run, default assignment
    best_s: float
    axes: tuple = ()
    exhaustive: Optional[tuple] = None  # with --exhaustive: the best of every distinct candidate, measured
    exhaustive_n: int = 0  # how many distinct candidates that was
    gap: Optional[float] = None  # the search's best over the exhaustive best, both re-timed together, - 1
    rejected: Optional[tuple] = None  # (the search's best, its re-timed median) where it saved under MIN_GAIN

    @property
    def found(self) -> tuple:
        """The search's best, kept or not."""
        return self.best if self.rejected is None else self.rejected[0]

    def show(self, assignment: tuple) -> str:
        """An assignment of the site's axes as `axis=value, ...` ("-" for none)."""
        return ", ".join(f"{k}={v}" for k, v in zip(self.axes, assignment)) or "-"


@dataclass
class TuneReport:
    sites: list[SiteReport] = field(default_factory=list)
    untuned: list[str] = field(default_factory=list)  # site keys of families the tuner does not measure
    skipped: list[str] = field(default_factory=list)  # site keys of families left out of this search
    profiled_s: float = 0.0  # one workload run with the model's tuple, selector calls recorded
    default_s: Optional[float] = None  # the model's tuple, median of the check's rounds beside the tuned one
    measured_s: Optional[float] = None  # the tuned tuple, median of the same rounds
    rounds: int = 0  # the check's rounds (each one run on either engine)
    default_phases: Optional[tuple[float, float]] = None  # (generate, rescore) medians of the check's rounds
    measured_phases: Optional[tuple[float, float]] = None
    round_savings: list[float] = field(default_factory=list)  # each round's default minus tuned, seconds
    search_s: float = 0.0

    @property
    def predicted_saving_s(self) -> float:
        return sum(s.default_s - s.best_s for s in self.sites)

    @property
    def measured_saving_s(self) -> Optional[float]:
        if self.default_s is None or self.measured_s is None:
            return None
        return self.default_s - self.measured_s

    @property
    def predicted_s(self) -> float:
        """The tuned tuple's workload time, predicted: the default's, measured beside it when checked
        (the profiled run's otherwise), minus the sites' gains."""
        base = self.profiled_s if self.default_s is None else self.default_s
        return base - self.predicted_saving_s

    @property
    def additivity_error(self) -> Optional[float]:
        if self.measured_s is None:
            return None
        return abs(self.measured_s - self.predicted_s) / self.measured_s

    def round_verdict(self) -> str:
        """What the check's rounds can tell: each round runs both tuples, so its saving is paired; where the
        rounds' savings span both no saving and the predicted one, their spread (on the GPU mostly the eager,
        host-bound rescoring) hides the difference at this many rounds."""
        lo, hi, n = min(self.round_savings), max(self.round_savings), len(self.round_savings)
        faster = sum(x > 0 for x in self.round_savings)
        text = f"each round's saving: {lo:.3f} to {hi:.3f} s, the tuned tuple faster in {faster} of {n} rounds"
        if lo <= 0 <= hi and lo <= self.predicted_saving_s <= hi:
            text += (f"; the spread holds both no saving and the predicted {self.predicted_saving_s:.3f} s: the check "
                     f"cannot tell them apart in {n} rounds (more with --repeats, or time the phase that was tuned)")
        return text

    def render(self) -> str:
        lines = ["| site | grid | measured | calls | default | tuned | site time default -> tuned |",
                 "|---|---|---|---|---|---|---|"]
        for s in self.sites:
            lines.append(f"| {s.key} | {s.grid} | {s.measured} ({s.measured / max(s.grid, 1):.0%}) | {s.calls} | "
                         f"{s.show(s.default)} | {s.show(s.best)} | "
                         f"{s.default_s * 1e3:.3f} -> {s.best_s * 1e3:.3f} ms |")
        kept = [s for s in self.sites if s.rejected is not None]
        if kept:
            lines.append("")
        for s in kept:
            found, found_s = s.rejected
            lines.append(f"{s.key}: kept the default; the search's best ({s.show(found)}) re-timed beside it "
                         f"{s.default_s * 1e3:.3f} -> {found_s * 1e3:.3f} ms, under the {MIN_GAIN:.0%} a move needs")
        checked = [s for s in self.sites if s.exhaustive is not None]
        if checked:
            lines += ["", "| site | distinct candidates measured | exhaustive best | search's best | "
                          "search over exhaustive |", "|---|---|---|---|---|"]
            for s in checked:
                lines.append(f"| {s.key} | {s.exhaustive_n} | {s.show(s.exhaustive)} | {s.show(s.found)} | "
                             f"{s.gap:+.1%} |")
        lines.append("")
        lines.append(f"workload, profiled run (model's tuple, selector calls recorded, once): "
                     f"{self.profiled_s:.3f} s")
        if self.measured_saving_s is None:
            lines.append(f"workload with the tuned tuple: predicted {self.predicted_s:.3f} s (saving predicted "
                         f"{self.predicted_saving_s:.3f} s from the profiled run; not measured)")
        else:
            phases = ""
            if self.default_phases is not None and self.measured_phases is not None:
                (g0, r0), (g1, r1) = self.default_phases, self.measured_phases
                phases = f" (generate {g0:.3f} -> {g1:.3f} s" + (  # (a serve rescores nothing)
                    f", rescore {r0:.3f} -> {r1:.3f} s)" if r0 or r1 else ")")
            lines.append(f"workload, model's tuple -> tuned, medians of {self.rounds} alternating rounds: "
                         f"{self.default_s:.3f} -> {self.measured_s:.3f} s{phases}; saving measured "
                         f"{self.measured_saving_s:.3f} s, predicted {self.predicted_saving_s:.3f} s "
                         f"(additivity error {self.additivity_error:.1%})")
            if self.round_savings:
                lines.append(self.round_verdict())
        if self.untuned:
            lines.append(f"kept at the tuple's values (not measured by this tuner yet): {', '.join(self.untuned)}")
        if self.skipped:
            lines.append(f"kept at the tuple's values (family not asked for): {', '.join(self.skipped)}")
        lines.append(f"search: {self.search_s:.1f} s")
        return "\n".join(lines)

"""`python -m detent_rl.solve`: solve selection programs and report pins, legal tuples and ablations."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from detent_rl.kernels.programs.registry import programs
from detent_rl.selir.dot import to_dot
from detent_rl.selir.report import render, report_row
from detent_rl.selir.solver import analyze


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detent_rl.solve", description=__doc__)
    ap.add_argument("--report", action="store_true", help="print the solver report (the default)")
    ap.add_argument("--program", action="append", help="only these programs (repeatable)")
    ap.add_argument("--dot", metavar="FILE", help="write the dependence graph with the cut highlighted "
                    "(one file per program and deployment when several are selected)")
    ap.add_argument("--list", action="store_true", help="list the programs and deployments")
    args = ap.parse_args(argv)
    table = programs()
    chosen = args.program or list(table)
    unknown = [p for p in chosen if p not in table]
    if unknown:
        print(f"unknown program(s) {unknown}; known: {sorted(table)}", file=sys.stderr)
        return 2
    jobs = [(name, dep, facts) for name in chosen for dep, facts in table[name][1].items()]
    if args.list:
        for name, dep, _ in jobs:
            print(f"{name}\t{dep}")
        return 0
    if args.dot:
        target = Path(args.dot)
        for name, dep, facts in jobs:
            spec, g, pins, _ = analyze(table[name][0], facts)
            path = target if len(jobs) == 1 else target.with_name(
                f"{target.stem}.{name}.{dep}".replace("/", "_") + (target.suffix or ".dot"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(to_dot(g, pins.values(), f"{name} on {dep}", spec.builder.names))
            print(f"wrote {path}")
    if args.report or not args.dot:
        rows = [report_row(table[name][0], dep, facts) for name, dep, facts in jobs]
        print(render(rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

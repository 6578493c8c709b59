"""`python -m detent_rl.bench`'s per-case arguments: `--commitment CASE=FILE,...` and `--max-num-tokens N,CASE=N`."""
from __future__ import annotations

from typing import Any, Callable


def per_case_tuples(text: str, cases: list[str], error: Callable[[str], Any]) -> dict[str, str]:
    """`--commitment`'s cases -> tuple files: FILE for every case, or CASE=FILE pairs, comma-separated."""
    if "=" not in text:
        return {c: text for c in cases}
    out: dict[str, str] = {}
    for part in (x.strip() for x in text.split(",") if x.strip()):
        case, sep, file = part.partition("=")
        if not sep or not file:
            error(f"--commitment {text!r}: {part!r} is not CASE=FILE")
        if case not in cases:
            error(f"--commitment {text!r}: case {case!r} is not among this run's --cases ({', '.join(cases)})")
        if case in out:
            error(f"--commitment {text!r}: case {case!r} named twice")
        out[case] = file
    return out


def per_case_tokens(text: str, cases: list[str], error: Callable[[str], Any]) -> dict[str, int]:
    """`--max-num-tokens`: N for every case, then CASE=N pairs for a case with its own (comma-separated);
    the default N under the key ""."""
    out: dict[str, int] = {}
    for part in (x.strip() for x in text.split(",") if x.strip()):
        case, sep, value = part.rpartition("=")
        if sep and case not in cases:
            error(f"--max-num-tokens {text!r}: case {case!r} is not among this run's --cases ({', '.join(cases)})")
        if case in out:
            error(f"--max-num-tokens {text!r}: {'case ' + repr(case) if case else 'the default'} given twice")
        try:
            out[case] = int(value)
        except ValueError:
            error(f"--max-num-tokens {text!r}: {value!r} in {part!r} is not a whole number")
        if out[case] < 1:
            error(f"--max-num-tokens {text!r}: {part!r}: give 1 or more tokens")
    if "" not in out:
        error(f"--max-num-tokens {text!r}: give the default N first (then CASE=N for a case with its own)")
    return out

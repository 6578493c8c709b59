"""Reward functions `(completion, task) -> float`, named in recipes by import path "module:function".

Built in (also loadable by their bare names):
- `gsm8k_numeric`: 1.0 iff the completion's final number equals the task's numeric answer, else 0.0.
  Works for GSM8K, reasoning_gym gsm_symbolic and basic_arithmetic (negative answers included).
- `math_boxed`: 1.0 iff the completion's last \boxed{...} matches a MATH-style (LaTeX) answer after
  Hendrycks et al.'s string normalization, or equals it as a number or simple fraction.
- `reasoning_gym_score`: reasoning_gym's own `score_answer` for tasks from a "reasoning_gym:<name>"
  source, on the completion's last <answer>...</answer> span (reasoning_gym's convention).
- `digit_share`: the share of the completion's non-space characters that are ASCII digits. A dense
  shaping reward: samples of a random-weight model already differ under it, so GRPO's advantages
  are nonzero and every step moves the weights (the built-in random configs' runs use it).
"""
from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Optional

from detent_rl.data import REASONING_GYM, Task

Reward = Callable[[str, Task], float]

# A number: optional sign and $, digits with optional thousands commas, optional decimals. Not
# preceded by a word character or '.', so "5-3" yields 5 and 3 (not -3) and "v2" or ".5" pieces don't count.
_NUMBER = re.compile(r"(?<![\w.])(-?)\$?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)")
_ANSWER_IS = re.compile(r"answer is", re.IGNORECASE)
# Values compare as exact fractions, so "72.0" == "72" and "1,000" == "1000". An integer answer must
# match exactly (a relative tolerance would pay an off-by-one on -131073014); a non-integer one within
# REL_TOL, which absorbs float printing noise such as 0.30000000000000004.
REL_TOL = Fraction(1, 10**9)


class RewardError(ValueError):
    """A reward that cannot be loaded or applied; names the import path or the task id."""


def parse_number(text: str) -> Optional[Fraction]:
    """The first number in `text` as an exact fraction ("$1,234.50" -> 2469/2, "-4" -> -4), or None."""
    m = _NUMBER.search(_normalize(text))
    return None if m is None else _value(m)


def _value(m: re.Match) -> Fraction:
    return Fraction(m.group(1) + m.group(2).replace(",", ""))


def final_number(completion: str) -> Optional[Fraction]:
    """The completion's answer: the first number after the last '####', else inside the last
    \\boxed{...}, else after the last "answer is", else the last number anywhere; None if none."""
    text = _normalize(completion)
    cut = text.rfind("####")
    if cut >= 0 and (n := parse_number(text[cut + 4:])) is not None:
        return n
    boxed = last_boxed(text)
    if boxed is not None and (n := parse_number(boxed)) is not None:
        return n
    said = list(_ANSWER_IS.finditer(text))
    if said and (n := parse_number(text[said[-1].end():])) is not None:
        return n
    numbers = list(_NUMBER.finditer(text))
    return _value(numbers[-1]) if numbers else None


def _normalize(text: str) -> str:
    return text.replace("\u2212", "-")  # a typeset minus sign is a minus


def gsm8k_numeric(completion: str, task: Task) -> float:
    """1.0 iff `final_number(completion)` equals the task's answer (exactly for an integer answer,
    within REL_TOL otherwise), else 0.0. A task answer that is not a number is an error naming the
    task (a silent 0 would train on noise)."""
    reference = parse_number(task.answer)
    if reference is None:
        raise RewardError(f"task {task.id}: gsm8k_numeric needs a numeric answer, got {task.answer!r}")
    got = final_number(completion)
    if got is None:
        return 0.0
    if reference.denominator == 1:
        return 1.0 if got == reference else 0.0
    return 1.0 if abs(got - reference) <= REL_TOL * max(1, abs(reference)) else 0.0


def last_boxed(text: str) -> Optional[str]:
    """The content of the last \\boxed{...} or \\fbox{...} (nested braces kept), or of "\\boxed x"
    up to a '$'; None if there is none or its braces never close."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5):]
    if rest.startswith(" "):
        return rest.split("$")[0].strip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None


def math_boxed(completion: str, task: Task) -> float:
    """1.0 iff the completion's last \\boxed{} equals the task's answer (itself boxed or not) after
    `normalize_math`, or both are numbers / simple fractions of equal value; else 0.0. There is no
    symbolic algebra: "2\\sqrt{2}" and "\\sqrt{8}" differ, as in Hendrycks et al.'s is_equiv."""
    got = last_boxed(completion)
    if got is None:
        return 0.0
    reference = last_boxed(task.answer)
    a, b = normalize_math(got), normalize_math(task.answer if reference is None else reference)
    if a == b:
        return 1.0
    x = _math_value(a)
    return 1.0 if x is not None and x == _math_value(b) else 0.0


_LATEX_NOISE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "\\displaystyle", "^{\\circ}", "^\\circ",
                "\\$", "$", "\\%", "%", "{,}", "\n")


def normalize_math(answer: str) -> str:
    """Hendrycks et al.'s MATH `strip_string`, condensed: drop spacing commands, \\left/\\right, degrees,
    $ and %, a trailing "\\text{ unit}", a short "x =" prefix and all spaces; dfrac/tfrac -> frac;
    \\frac12 -> \\frac{1}{2}, \\sqrt2 -> \\sqrt{2}; ".5" -> "0.5"."""
    s = re.sub(r"\\text\{ [^{}]*\}\s*$", "", answer.strip())  # "10\\text{ cm}": a unit
    for noise in _LATEX_NOISE:
        s = s.replace(noise, "")
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:
        s = s.split("=")[1]
    s = s.replace(" ", "").rstrip(".")
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)


def _math_value(s: str) -> Optional[Fraction]:
    """The exact value of a normalized plain number ("-1,000.5"), "a/b" or "\\frac{a}{b}"; else None."""
    if re.fullmatch(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?", s):
        return Fraction(s.replace(",", ""))
    m = re.fullmatch(r"(-?)(?:\\frac\{(-?\d+)\}\{(-?\d+)\}|(-?\d+)/(-?\d+))", s)
    if m is None:
        return None
    num, den = (int(m.group(2)), int(m.group(3))) if m.group(2) else (int(m.group(4)), int(m.group(5)))
    return None if den == 0 else Fraction(-num if m.group(1) else num, den)


def reasoning_gym_score(completion: str, task: Task) -> float:
    """reasoning_gym's score of the completion's last <answer>...</answer> span (None without one),
    for a task whose id is "reasoning_gym:<name>:<seed>:<index>"; the item is regenerated from the
    id and must have the task's question. Tasks made with a task_config ("<name>@<digest>") are
    refused: their id does not hold the config to regenerate them with."""
    from reasoning_gym.utils import extract_answer

    name, seed, index = _reasoning_gym_key(task)
    dataset, entry = _reasoning_gym_entry(name, seed, index)
    if entry["question"] != task.question:
        raise RewardError(f"task {task.id}: reasoning_gym regenerates a different question for this id "
                          f"(another reasoning_gym version?)")
    return float(dataset.score_answer(extract_answer(completion), entry))


def _reasoning_gym_key(task: Task) -> tuple[str, int, int]:
    parts = task.id.split(":")
    if len(parts) != 4 or f"{parts[0]}:" != REASONING_GYM or not (parts[2].lstrip("-").isdigit()
                                                                   and parts[3].isdigit()):
        raise RewardError(f"task {task.id}: reasoning_gym_score needs a task from a {REASONING_GYM}<name> "
                          f"source (id '{REASONING_GYM}<name>:<seed>:<index>')")
    if "@" in parts[1]:
        raise RewardError(f"task {task.id}: reasoning_gym_score regenerates items of the default task_config "
                          f"only; use gsm8k_numeric (or a reward of your own) with a task_config")
    return parts[1], int(parts[2]), int(parts[3])


@functools.lru_cache(maxsize=4096)
def _reasoning_gym_entry(name: str, seed: int, index: int) -> tuple[Any, dict]:
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(name, size=index + 1, seed=seed)
    return dataset, dataset[index]

def digit_share(completion: str, task: Task) -> float:
    """The share of the completion's non-space characters that are ASCII digits (0.0 if it has none)."""
    chars = [c for c in completion if not c.isspace()]
    return sum("0" <= c <= "9" for c in chars) / len(chars) if chars else 0.0


BUILTIN: dict[str, Reward] = {"gsm8k_numeric": gsm8k_numeric, "math_boxed": math_boxed,
                              "reasoning_gym_score": reasoning_gym_score, "digit_share": digit_share}


def load_reward(path: str) -> Reward:
    """The reward function at import path "module:function" (or a BUILTIN name)."""
    if path in BUILTIN:
        return BUILTIN[path]
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {path!r}: expected an import path 'module:function' or one of {sorted(BUILTIN)}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or module_name == e.name or module_name.startswith(e.name + "."):
            raise RewardError(f"reward {path!r}: no module named {module_name!r}") from e
        raise RewardError(f"reward {path!r}: importing {module_name!r} failed: {e}") from e
    except Exception as e:  # the module exists but does not import (SyntaxError, its own errors)
        raise RewardError(f"reward {path!r}: importing {module_name!r} failed ({type(e).__name__}: {e})") from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardError(f"reward {path!r}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardError(f"reward {path!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn

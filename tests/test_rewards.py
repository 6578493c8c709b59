"""Rewards: gsm8k_numeric pays exactly the right numbers (wrong ones get 0.0), math_boxed pays equivalent LaTeX,
and a reward named by its import path loads, or is refused naming what is wrong."""
from __future__ import annotations

import pytest

from detent_rl.data import Task
from detent_rl.rewards import (RewardError, digit_share, final_number, gsm8k_numeric, last_boxed, load_reward,
                               math_boxed, reasoning_gym_score)


RIGHT = [  # (completion, answer): each must earn 1.0
    ("She sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("#### 72.0", "72"),
    ("The answer is 72.", "72"),
    ("The final answer is $1,250,000.", "1,250,000"),
    ("1250000", "1,250,000"),
    ("So the total is 1,250,000", "1250000"),
    ("5 - 3 - 6 = -4\nThe answer is -4", "-4"),
    ("The answer is −4", "-4"),  # typeset minus
    ("Result: 2 - 9 = -7", "-7"),
    ("It costs $0.50 each, so $2.5 in total", "2.50"),
    ("0.1 + 0.2 = 0.30000000000000004", "0.3"),  # float printing noise
    ("We get \\boxed{18} apples.", "18"),
    ("#### 18 (then 3 more words about 5 things)", "18"),
    ("The answer is 42. Check: 6 * 7 = 42 and 40 + 2 = 42", "42"),
    ("Step 1: 12 * 5 = 60. Step 2: 60 / 6 = 10", "10"),
]
WRONG = [  # each must earn 0.0
    ("#### 720", "72"),
    ("#### 7", "72"),
    ("The answer is 4", "-4"),
    ("The answer is -72", "72"),
    ("5 - 3 = 2", "-4"),  # a difference's operand is not a negative answer
    ("The answer is 72.5", "72"),
    ("#### -131073013", "-131073014"),  # an off-by-one on a large integer is wrong
    ("#### 72.000001", "72"),
    ("The answer is 0.333", "0.33"),
    ("#### 73\nThe answer is 72", "72"),  # '####' is preferred over 'answer is'
    ("The answer is 71, not 72", "72"),   # ... and 'answer is' over the last number
    ("I don't know.", "72"),
    ("", "72"),
    ("1,2", "12"),
    ("version v72", "72"),
]


@pytest.mark.parametrize("completion,answer", RIGHT)
def test_gsm8k_numeric_pays_the_right_number(completion, answer):
    assert gsm8k_numeric(completion, Task("t", "q", answer)) == 1.0


@pytest.mark.parametrize("completion,answer", WRONG)
def test_gsm8k_numeric_refuses_wrong_numbers(completion, answer):
    assert gsm8k_numeric(completion, Task("t", "q", answer)) == 0.0


def test_gsm8k_numeric_needs_a_numeric_reference():
    assert final_number("#### nothing here, but 3 later") == 3
    with pytest.raises(RewardError, match=r"task t:9: gsm8k_numeric needs a numeric answer, got 'blue'"):
        gsm8k_numeric("blue", Task("t:9", "q", "blue"))


def test_digit_share_is_the_share_of_digits_among_non_space_characters():
    t = Task("t", "q", "1")
    texts = ("", "   ", "abc", "12 34", "a1 b2", "#### 7\n")
    assert [digit_share(c, t) for c in texts] == [0.0, 0.0, 0.0, 1.0, 0.5, 0.2]
    assert load_reward("digit_share") is digit_share


def test_load_reward(tmp_path, monkeypatch):
    assert load_reward("detent_rl.rewards:gsm8k_numeric") is gsm8k_numeric
    assert load_reward("gsm8k_numeric") is gsm8k_numeric
    assert load_reward("reasoning_gym_score") is reasoning_gym_score
    assert load_reward("detent_rl.rewards:math_boxed") is math_boxed
    (tmp_path / "my_rewards.py").write_text("def length(c, t):\n    return float(len(c))\nSCALE = 2\n")
    (tmp_path / "broken_rewards.py").write_text("import detent_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("my_rewards:length")("abc", Task("t", "q", "1")) == 3.0
    cases = {
        "gsm8k": r"reward 'gsm8k': expected an import path 'module:function'",
        "detent_no_such_module:f": r"reward 'detent_no_such_module:f': no module named 'detent_no_such_module'",
        "detent_rl.no_such:f": r"reward 'detent_rl.no_such:f': no module named 'detent_rl.no_such'",
        "my_rewards:missing": r"reward 'my_rewards:missing': module 'my_rewards' has no attribute 'missing'",
        "my_rewards:SCALE": r"reward 'my_rewards:SCALE': 'SCALE' is a int, not callable",
        "broken_rewards:f": r"reward 'broken_rewards:f': importing 'broken_rewards' failed.*detent_no_such_dependency",
    }
    for path, message in cases.items():
        with pytest.raises(RewardError, match=message):
            load_reward(path)


MATH_RIGHT = [  # (completion, reference answer): each must earn 1.0
    ("so the result is \\boxed{\\frac{1}{2}}.", "\\frac12"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{.5}", "0.5"),
    ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{-\\frac{3}{4}}", "-3/4"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left(3,\\frac{\\pi}{2}\\right)"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "The answer: $\\boxed{\\frac{1}{\\sqrt2}}$"),  # boxed reference
    ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),
]
MATH_WRONG = [
    ("\\boxed{3}", "4"),
    ("The answer is 4", "4"),  # no \boxed: math_boxed pays only a boxed answer
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),  # no symbolic algebra (documented)
    ("\\boxed{\\frac{1}{3}}", "0.33"),
    ("\\boxed{4}, no wait \\boxed{3}", "4"),
    ("\\boxed{\\frac{1}{2", "\\frac{1}{2}"),  # braces never close
    ("\\boxed{(3,5)}", "(3,6)"),
]


@pytest.mark.parametrize("completion,answer", MATH_RIGHT)
def test_math_boxed_pays_equivalent_latex(completion, answer):
    assert math_boxed(completion, Task("m", "q", answer)) == 1.0


@pytest.mark.parametrize("completion,answer", MATH_WRONG)
def test_math_boxed_refuses_different_answers(completion, answer):
    assert math_boxed(completion, Task("m", "q", answer)) == 0.0


def test_last_boxed_keeps_nested_braces():
    assert last_boxed("a \\boxed{\\frac{1}{\\sqrt{2}}} b") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("$\\boxed 7$") == "7"
    assert last_boxed("\\fbox{12}") == "12"
    assert last_boxed("none") is None
    assert final_number("\\boxed{12}, so the answer is 5") == 12  # gsm8k_numeric reads a box before 'answer is'
    assert final_number("\\boxed{12}\n#### 5") == 5  # ... and '####' before a box

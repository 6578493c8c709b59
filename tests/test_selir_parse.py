"""Programs outside the SelIR subset are rejected at decoration time, naming file, line and construct."""
from __future__ import annotations

import pytest

from detent_rl.selir import SelIRError
from selir_helpers import HEADER, load_module

# (construct, body lines of the program, words the message must contain); the offending line is
# always the one marked `# <-`.
BAD = [
    ("while", ["n = 0", "while n < x:  # <-", "    n = n + 1", "return {'n': n}"], "while loop"),
    ("import", ["import math  # <-", "return {'n': x}"], "import"),
    ("recursion", ["return prog(x)  # <-"], "recursive"),
    ("unknown call", ["n = helper_fn(x)  # <-", "return {'n': n}"], "helper_fn"),
    ("builtin print", ["print(x)  # <-", "return {'n': x}"], "print"),
    ("side effect", ["CACHE.append(x)  # <-", "return {'n': x}"], "effect"),
    ("method call", ["n = TABLE.get(x)  # <-", "return {'n': n}"], "call"),
    ("lambda", ["f = lambda v: v  # <-", "return {'n': x}"], "lambda"),
    ("list", ["n = [x, x]  # <-", "return {'n': x}"], "list"),
    ("comprehension", ["n = tuple(v for v in (1, 2))  # <-", "return {'n': x}"], "generator"),
    ("nested def", ["def g():  # <-", "    return 1", "return {'n': x}"], "nested function"),
    ("try", ["try:  # <-", "    n = x", "except Exception:", "    n = 0", "return {'n': n}"], "try"),
    ("global", ["global TABLE  # <-", "return {'n': x}"], "global"),
    ("attribute store", ["x.y = 1  # <-", "return {'n': x}"], "assignment target"),
    ("item store", ["TABLE[1] = 2  # <-", "return {'n': x}"], "assignment target"),
    ("f-string", ["s = f'{x}'  # <-", "return {'n': x}"], "f-string"),
    ("break", ["for i in (1, 2):", "    break  # <-", "return {'n': x}"], "break"),
    ("mutable global", ["n = CACHE  # <-", "return {'n': n}"], "not a static"),
    ("with", ["with open('f') as fh:  # <-", "    pass", "return {'n': x}"], "with"),
    ("raise", ["raise ValueError(x)  # <-"], "raise"),
    ("undefined name", ["n = undefined_table  # <-", "return {'n': n}"], "undefined_table"),
]


def _source(lines: list[str], signature: str = "x: Runtime[int]") -> tuple[str, int]:
    head = HEADER + "\nCACHE = []\n\ndef helper_fn(v):\n    return v\n\n@selection\n"
    src = head + f"def prog({signature}):\n" + "".join(f"    {l}\n" for l in lines)
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "# <-" in l)
    return src, line


@pytest.mark.parametrize("construct,lines,words", BAD, ids=[b[0] for b in BAD])
def test_rejected_construct_names_file_and_line(tmp_path, construct, lines, words):
    src, line = _source(lines)
    with pytest.raises(SelIRError) as info:
        load_module(src, tmp_path)
    err = info.value
    assert err.line == line, f"{construct}: reported line {err.line}, expected {line}: {err}"
    assert err.file is not None and err.file.endswith(".py") and str(tmp_path) in err.file
    assert f":{line}:" in str(err)
    assert words.lower() in str(err).lower(), str(err)


@pytest.mark.parametrize("signature,words", [
    ("x", "must be annotated"),
    ("x: int", "must be annotated"),
    ("x: Runtime[list]", "unsupported type"),
    ("x: Runtime[int] = 3", "without defaults"),
    ("*xs: Runtime[int]", "plain named parameters"),
])
def test_rejected_signatures(tmp_path, signature, words):
    src, _ = _source(["return {'n': 1}  # <-"], signature)
    with pytest.raises(SelIRError) as info:
        load_module(src, tmp_path)
    assert words in str(info.value) and str(tmp_path) in str(info.value)


def test_valid_subset_is_accepted_and_evaluates_like_python(tmp_path):
    mod = load_module(HEADER + '''
@selection
def helper(v: Runtime[int]):
    if v > 5:
        return v // 2
    return -v

@selection
def prog(x: Runtime[int], big: Fact[bool], name: Fact[str]):
    assume(0 <= x <= 100)
    a, b = x % 7, x ** 2
    a += 1
    total = 0
    for key in TABLE:
        if key <= x and not big:
            total = total + TABLE[key].a
    row = TABLE[nearest_key(TABLE, x)]
    tag = "big" if big or name == "wide" else "small"
    return {"a": a, "b": b, "total": total, "h": helper(x), "row": row, "tag": tag,
            "m": max(a, b, 3), "c": ceil(x / 3), "in": x in (1, 2, 3), "len": len(TABLE)}
''', tmp_path)
    out = mod.prog(x=9, big=False, name="wide")
    assert out == {"a": 3, "b": 81, "total": 3 + 7 + (-4), "h": 4, "row.a": -4, "row.b": 11, "tag": "big",
                   "m": 81, "c": 3, "in": False, "len": 4}


def test_branches_returning_different_selection_points_are_rejected(tmp_path):
    mod = load_module(HEADER + '''
@selection
def prog(x: Runtime[int]):
    assume(0 <= x <= 9)
    if x > 3:
        return {"a": 1}
    return {"a": 1, "b": 2}  # <-
''', tmp_path)
    from detent_rl.selir.specialize import specialize
    with pytest.raises(SelIRError, match="different shapes"):
        specialize(mod.prog, {})

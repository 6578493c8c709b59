"""The recipes' YAML machinery: a YAML 1.2-core dialect, and raw data -> frozen dataclasses with
every error one line naming the file and key path (`RecipeError`). Generic over the schema: the
recipe's sections live in `config.py`, its rules in `recipe_check.py` and `recipe_parallel.py`.

Type rules: bool takes only true/false, int never takes a bool, float takes ints (stored as float)
and must be finite, tuples have their exact length, `Optional[X]` takes null, `Literal` its values
(a switch of "on"/"off" values also takes true/false, as a boolean option it replaced was written),
`Mapping[str, Any]` a frozen mapping of scalars or lists of scalars (keyword arguments); a
dataclass field is a section. Unknown keys are refused with the closest known one suggested.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Sequence, Union, get_args, get_origin, get_type_hints

import yaml


class RecipeError(ValueError):
    """A recipe that cannot run; the message is one line naming the file, the key path and the value."""


def parse_overrides(overrides: Sequence[str], source: str = "<command line>") -> dict[str, tuple[Any, str]]:
    """`["train.steps=3", ...]` -> {"train.steps": (3, "train.steps=3")}; values are YAML scalars
    (`null`, numbers, true/false, strings). A later override of the same key wins."""
    out: dict[str, tuple[Any, str]] = {}
    for text in overrides:
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
            raise RecipeError(f"{source}: override {text!r}: expected key.sub=value, e.g. train.steps=3")
        try:
            out[key] = (yaml.load(value, Loader=Loader), text)
        except yaml.YAMLError as e:
            raise RecipeError(f"{source}: {key}: override {text!r} is not a YAML value "
                              f"({getattr(e, 'problem', None) or e})") from e
    return out


# ---- YAML dialect -------------------------------------------------------------------------------

class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
         "tag:yaml.org,2002:timestamp")
Loader.yaml_implicit_resolvers = {
    c: [(tag, rx) for tag, rx in rs if tag not in _TAGS] for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Loader.add_implicit_resolver(_TAGS[0], re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
Loader.add_implicit_resolver(_TAGS[1], re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
Loader.add_implicit_resolver(_TAGS[2], re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))
Loader.add_constructor(_TAGS[1], lambda loader, node: int(loader.construct_scalar(node)))  # no 1.1 octal


# ---- parsing and type checking ------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    source: str
    origin: Mapping[str, str]

    def error(self, path: str, message: str) -> RecipeError:
        key = next((k for k in self.origin if path == k or path.startswith((f"{k}.", f"{k}["))), None)
        via = f" (from override {self.origin[key]!r})" if key else ""
        return RecipeError(f"{self.source}: {path}: {message}{via}")


def schema_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.compare]  # Recipe's provenance fields are not keys


def build(cls: type, raw: Any, path: str, ctx: Context) -> Any:
    if raw is None:  # an empty section in the file
        raw = {}
    if not isinstance(raw, Mapping):
        raise ctx.error(path or "<top>", f"expected a mapping (a section), got {show(raw)}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in schema_fields(cls)}
    for key in raw:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), fields, n=1)
            maybe = f"did you mean {hint[0]!r}? " if hint else ""
            raise ctx.error(join_path(path, str(key)),
                            f"unknown key ({maybe}{path or 'a recipe'} takes: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        sub = join_path(path, name)
        if name in raw:
            kwargs[name] = coerce(raw[name], hints[name], sub, ctx)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if dataclasses.is_dataclass(hints[name]):
                kwargs[name] = build(hints[name], {}, sub, ctx)  # reports the section's missing key
            else:
                raise ctx.error(sub, "required key is missing")
    return cls(**kwargs)


def coerce(value: Any, tp: Any, path: str, ctx: Context, nullable: bool = False) -> Any:
    """`value` as type `tp`, or a RecipeError naming `path` and the value."""
    def bad(what: str) -> RecipeError:
        return ctx.error(path, f"expected {what}{' or null' if nullable else ''}, got {show(value)}")

    if dataclasses.is_dataclass(tp):
        return build(tp, value, path, ctx)
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union:  # Optional[X]
        if value is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(value, inner, path, ctx, nullable=True)
    if origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        if isinstance(value, bool) and {"on", "off"} <= set(args):
            return "on" if value else "off"
        raise bad(f"one of {', '.join(map(repr, args))}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad(f"a list of {len(args)} numbers")
        return tuple(coerce(v, a, f"{path}[{i}]", ctx) for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is Mapping:
        return frozen_kwargs(value, path, ctx)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad("an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise bad("a finite number" if isinstance(value, float) else "a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad("a string")
    raise TypeError(f"config schema: {path} has an unsupported annotation {tp!r}")  # a bug here, not in the recipe


_SCALAR = (str, int, float, bool, type(None))


def frozen_kwargs(value: Any, path: str, ctx: Context) -> Mapping[str, Any]:
    """A mapping of str keys to scalars or lists of scalars, frozen."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ctx.error(path, f"expected a mapping of keyword arguments, got {show(value)}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise ctx.error(path, f"expected string keys, got {show(k)}")
        if isinstance(v, (list, tuple)) and all(isinstance(x, _SCALAR) for x in v):
            v = tuple(v)
        elif not isinstance(v, _SCALAR):
            raise ctx.error(f"{path}.{k}", f"expected a scalar or a list of scalars, got {show(v)}")
        out[k] = v
    return MappingProxyType(out)


def set_override(root: type, raw: dict, key: str, value: Any, text: str, source: str) -> None:
    """Put one override into the raw data of schema `root`, refusing a key the schema does not have."""
    keys, cls, node = key.split("."), root, raw
    for i, k in enumerate(keys):
        fields = [f.name for f in schema_fields(cls)]
        if k not in fields:
            raise RecipeError(f"{source}: {'.'.join(keys[: i + 1])}: unknown key in override {text!r} "
                              f"({'.'.join(keys[:i]) or 'a recipe'} takes: {', '.join(fields)})")
        tp, rest = get_type_hints(cls)[k], keys[i + 1:]
        if not rest:
            node[k] = value
            return
        inside_kwargs = get_origin(tp) is Mapping and len(rest) == 1  # data.task_config.max_terms=2
        if not inside_kwargs and not dataclasses.is_dataclass(tp):
            raise RecipeError(f"{source}: {'.'.join(keys[: i + 1])}: not a section, so override {text!r} "
                              f"cannot set a key inside it")
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            return  # the file's own non-mapping value is reported by the type check
        if inside_kwargs:
            child[rest[0]] = value
            return
        node, cls = child, tp


# ---- small helpers ------------------------------------------------------------------------------

def get_path(obj: Any, path: str) -> Any:
    for k in path.split("."):
        obj = getattr(obj, k)
    return obj


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def copy_raw(raw: Any) -> Any:
    if isinstance(raw, Mapping):
        return {k: copy_raw(v) for k, v in raw.items()}
    if isinstance(raw, (list, tuple)):
        return [copy_raw(v) for v in raw]
    return raw


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in schema_fields(type(value))}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value

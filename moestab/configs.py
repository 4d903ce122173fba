"""Typed configs: field docstrings, YAML loading and argparse wiring for frozen dataclasses.

A config is a frozen dataclass whose fields each carry a docstring (the string literal right
under the field). ``field_docs`` reads those docstrings from the source, so ``--help``, the YAML
loader and docs share one description per field.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A config value or file is invalid; the message says what is valid."""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass, read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(scalar type, optional?) of a field annotation such as ``int | None`` or ``tuple[int, ...]``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner, _ = _base_type(args[0])
        return inner, True
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0]), False
    if origin in (tuple, list):
        return origin, False
    return annotation, False


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()) -> None:
    """One ``--field-name`` option per field; defaults are left unset so YAML values are not overridden."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        typ, _ = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f"{docs.get(f.name, '')} (default: {default!r})"
        literal = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else None
        if typ is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            suffix = "; comma-separated" if typ in (tuple, list) else ""
            parser.add_argument(flag, dest=f.name, default=None, choices=literal, metavar=None if literal else
                                f.name.upper(), help=help_text + suffix)


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of field: value, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def coerce(cls: type, name: str, raw: Any) -> Any:
    """Convert a YAML / command-line value to the field's type, with a clear error."""
    hint = typing.get_type_hints(cls)[name]
    typ, optional = _base_type(hint)
    if raw is None or (optional and isinstance(raw, str) and raw.lower() in ("none", "null", "")):
        if optional:
            return None
        raise ConfigError(f"{name} may not be empty")
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ in (tuple, list):
            items = raw if isinstance(raw, list | tuple) else [s for s in str(raw).split(",") if s.strip()]
            (elem,) = {a for a in typing.get_args(_strip_optional(hint)) if a is not Ellipsis} or {str}
            try:
                return tuple(_scalar(elem, x) for x in items)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{name}: {raw!r} is not a comma-separated list of {elem.__name__} values") from exc
        return _scalar(typ, raw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {raw!r} is not a valid {getattr(typ, '__name__', typ)}") from exc


def _scalar(typ: type, raw: Any) -> Any:
    """``raw`` as ``typ``; YAML booleans are not numbers (``steps: true`` would otherwise read as 1)."""
    if typ in (int, float) and isinstance(raw, bool):
        raise ValueError(raw)
    if typ is int and isinstance(raw, float) and not raw.is_integer():
        raise ValueError(raw)
    return typ(raw)


def _strip_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def build_config(cls: type[C], *layers: dict[str, Any]) -> C:
    """Instantiate ``cls`` from dicts applied in order (later wins); unknown keys are an error."""
    valid = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for layer in layers:
        for name, raw in layer.items():
            if name not in valid:
                raise ConfigError(f"unknown config field {name!r}; valid fields: {', '.join(valid)}")
            if raw is not None:
                values[name] = coerce(cls, name, raw)
    return cls(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    out = dataclasses.asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

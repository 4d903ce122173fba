"""Typed configs: field docstrings, YAML loading, argparse wiring and validation rules for frozen dataclasses.

A config is a frozen dataclass whose fields each carry a docstring (the string literal right
under the field). ``field_docs`` reads those docstrings from the source, so ``--help``, the YAML
loader and docs share one description per field.

The validation rules at the end are written once for every settings class: ``moestab train``'s ``TrainConfig`` and
the probes' ``ProbeSettings`` call the same functions, so a bound cannot drift apart between them. Each rule is one
small function that raises :class:`ConfigError` naming the setting and what is valid (the probes re-raise it as
their ``ProbeError``). A rule takes the setting's name as its caller spells it (``seed``, ``--threads``); where the
two callers have always worded a refusal differently, a keyword keeps each wording, and the tests pin both.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import inspect
import itertools
import math
import os
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import yaml

from moestab.text import ECHO_LIMIT, UserFileError, clip, read_user_text, shown

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
    """The ``field: value`` mapping of a config file, with one clear :class:`ConfigError` for anything else."""
    if not str(path).strip():
        raise ConfigError("--config is empty; give a YAML file of config fields or leave out --config")
    path = Path(path)
    try:
        text = read_user_text(path, what="config file", expected="give a YAML file of config fields")
    except UserFileError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain values only
    except _DuplicateKey as exc:
        raise ConfigError(f"config file {path}, line {exc.line}: key {shown(exc.key)} is given twice (first on "
                          f"line {exc.first}); give each key once") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {clip(str(exc), 2 * ECHO_LIMIT)}") from exc
    except (ValueError, RecursionError) as exc:  # an integer past Python's 4,300 digits; nesting past the stack
        raise ConfigError(f"config file {path} is not usable YAML: {clip(str(exc) or type(exc).__name__)}") from exc
    if data is None or data == {}:
        raise ConfigError(f"config file {path} is empty; give settings (field: value lines) or leave out --config")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of field: value, got {_kind(data)}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


class _DuplicateKey(Exception):
    """A mapping of a YAML file gives ``key`` twice: on ``first`` and again on ``line`` (1-based)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key, line, first)
        self.key, self.line, self.first = key, line, first


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base': its keys may be overridden
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKey(key, line, seen[key])
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_SCALARS = (str, int, float, bool, datetime.date)
"""Python types of YAML scalars; anything else (a list, a mapping) is not one value."""

_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _kind(raw: Any) -> str:
    """What ``raw`` is, in words, for an error: 'a list of 9 items'."""
    if isinstance(raw, list | tuple | set | dict):
        return f"a {'mapping' if isinstance(raw, dict) else 'list'} of {len(raw)} item{'s' * (len(raw) != 1)}"
    return f"a {type(raw).__name__}"


def coerce(cls: type, name: str, raw: Any) -> Any:
    """Convert a YAML / command-line value to the field's type, with a clear error.

    An empty string is kept for a text field (the config says what that field needs instead) and refused for any
    other; 'none' / 'null' unset an optional field."""
    hint = typing.get_type_hints(cls)[name]
    typ, optional = _base_type(hint)
    listed = typ in (tuple, list)
    unset = ("none", "null", "") if listed else ("none", "null")  # an empty list: its default
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in unset):
        if optional:
            return None
        raise ConfigError(f"{name} may not be empty")
    elem = next(iter({a for a in typing.get_args(_strip_optional(hint)) if a is not Ellipsis} or {str})) \
        if listed else typ
    kind = _KINDS.get(elem, getattr(elem, "__name__", str(elem)))
    if not isinstance(raw, _SCALARS) and not (listed and isinstance(raw, list | tuple)):
        takes = f"a list of single values, each {kind}" if listed else f"one value, {kind}"
        raise ConfigError(f"{name}: got {_kind(raw)}; {name} takes {takes}")
    if isinstance(raw, str) and not raw.strip() and typ is not str and not listed:
        raise ConfigError(f"{name}: the value is empty; give {kind} or leave {name} out for its default")
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if listed:
            items = raw if isinstance(raw, list | tuple) else [s for s in str(raw).split(",") if s.strip()]
            bad = next((i for i, x in enumerate(items) if not isinstance(x, _SCALARS)), None)
            if bad is not None:
                raise ConfigError(f"{name}: item {bad + 1} is {_kind(items[bad])}; {name} takes a list of single "
                                  f"values, each {kind}")
            try:
                return tuple(_scalar(elem, x) for x in items)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{name}: {shown(raw)} is not a comma-separated list of {elem.__name__} "
                                  "values") from exc
        return _scalar(typ, raw)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {shown(raw)} is not a valid {getattr(typ, '__name__', typ)}") from exc


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
                raise ConfigError(f"unknown config field {shown(name)}; valid fields: {', '.join(valid)}")
            if raw is not None:
                values[name] = coerce(cls, name, raw)
    return cls(**values)


def folder_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) a folder: a file at it or at one of its parents; ``None`` when it can."""
    target = Path(path).expanduser()
    for candidate in (target, *target.parents):
        if candidate.exists():
            if candidate.is_dir():
                return None
            if candidate == target:
                return f"{shown(str(path))} is a file, not a folder"
            return f"{shown(str(path))} cannot be a folder: {candidate} is a file"
    return None


def config_to_dict(config: Any) -> dict[str, Any]:
    out = dataclasses.asdict(config)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


# ---- validation rules shared by the settings classes (TrainConfig, ProbeSettings) ----

SEED_LIMIT = 2**63
"""Seeds are integers 0 <= seed < SEED_LIMIT: what torch.manual_seed and its generators take."""
MAX_THREADS = 4096
"""Most torch CPU threads (TrainConfig.threads, the probes' --threads): more than any machine's cores."""
MAX_NEW_TOKENS = 65_536
"""Longest response cap (TrainConfig.max_new_tokens, the step probes' max_new_tokens)."""
MAX_STEP_SEQUENCES = 2**20
"""Most sequences in one step's rollout (prompts x group size): each is generated and scored several times per step,
so a million is already hours per step on a GPU node; more is a typo (1e8 prompts hung with no output)."""
MAX_EVAL_SIZE = 100_000
"""Largest held-out eval set: every eval generates each greedily, so more is a typo (1e9 hung building the set)."""
RATE_BOUNDS: dict[str, tuple[float, float, str]] = {
    "lr": (1e-9, 1.0, "below 1e-9 an Adam step rounds away in a float32 weight; above 1 it diverges at once"),
    "temperature": (1e-2, 1e2, "below 0.01 sampling is greedy and log-probs overflow; above 100 it is uniform noise"),
    "weight_decay": (0.0, 10.0, "decoupled decay shrinks each weight by lr x weight_decay a step; published runs "
                                "use <= 0.1"),
    "kl_coef": (0.0, 100.0, "a KL term 100x the policy loss leaves nothing to learn"),
    "router_aux_loss_coef": (0.0, 100.0, "Qwen3-MoE trains with 0.001; 100x the policy loss is a typo"),
    "clip_high": (0.0, 100.0, "a ratio bound of 1 + 100 clips nothing"),
    "warm_start_aux_loss_coef": (0.0, 100.0, "Switch and OLMoE pre-train with 0.01; 100x the language loss is a typo"),
    "warm_start_z_loss_coef": (0.0, 100.0, "ST-MoE and OLMoE pre-train with 0.001; 100x the language loss is a typo"),
}
"""Settings that are rates or coefficients -> (lowest, highest, why): values outside pass the type check but end a
run at step 1 (1e300) or finish it with unchanged weights (lr 1e-320, temperature 1e-30), so they are refused up
front. The lower bound is exclusive for lr, temperature and clip_high (> 0 is required), inclusive otherwise."""


def is_integer(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (YAML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: object) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``, nor nan or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_at_least(name: str, value: int, low: int, *, what: str = "an integer ") -> None:
    """``value`` is an integer >= ``low``; ``what`` words the refusal ('' where the type is already known)."""
    if not is_integer(value) or value < low:
        raise ConfigError(f"{name} must be {what}>= {low}, got {shown(value)}")


def check_at_most(name: str, value: int, high: int, why: str) -> None:
    """``value`` is at most ``high``: a larger one is a typo, ``why`` says what it would mean."""
    if value > high:
        raise ConfigError(f"{name} must be at most {high:,} ({why}), got {shown(value)}")


def check_rate(name: str, value: float) -> None:
    """``value`` of the rate ``name`` is finite and inside :data:`RATE_BOUNDS`."""
    low, high, why = RATE_BOUNDS[name]
    if low > 0:
        check_finite(name, value, f"in [{low:g}, {high:g}] ({why})", lambda v: low <= v <= high)
    elif name == "clip_high":
        check_finite(name, value, f"in (0, {high:g}] ({why})", lambda v: 0 < v <= high)
    else:
        check_finite(name, value, f"in [0, {high:g}] ({why})", lambda v: 0 <= v <= high)


def check_finite(name: str, value: float, rule: str, ok: Callable[[float], bool]) -> None:
    """``value`` is a finite number for which ``ok`` holds; ``rule`` says which in words ('> 0')."""
    if not is_finite_number(value) or not ok(value):
        raise ConfigError(f"{name} must be a finite number {rule}, got {shown(value)}")


def check_choice(name: str, value: str, valid: Sequence[str]) -> None:
    """``value`` is one of ``valid``."""
    if value not in valid:
        raise ConfigError(f"{name}: unknown {shown(value)}; valid: {', '.join(valid)}")


def check_seed(name: str, seed: int) -> None:
    """``seed`` is an integer ``0 <= seed < 2**63`` (what torch's generators take)."""
    if not is_integer(seed) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{name} must be an integer 0 <= {name} < 2**63 (what torch's random generators take), "
                          f"got {shown(seed)}")


def check_group_size(name: str, group_size: int) -> None:
    """Samples per prompt: at least 2, the smallest group whose advantages can differ from 0."""
    check_at_least(name, group_size, 2)


def check_threads(name: str, threads: int | None, *, what: str = "an integer ") -> None:
    """torch CPU threads: ``None`` (torch's choice) or 1 to :data:`MAX_THREADS`."""
    if threads is not None:
        check_at_least(name, threads, 1, what=what)
        check_at_most(name, threads, MAX_THREADS, "more than any machine's cores")


def check_response_cap(name: str, tokens: int | None, *, as_range: bool = False) -> None:
    """Response length cap: ``None`` (the task's default) or an integer 1 to :data:`MAX_NEW_TOKENS`, far beyond a
    response an RL step on one machine trains on. ``as_range``: one refusal stating the whole range (the probes'
    wording) instead of the bound that failed."""
    if tokens is None:
        return
    if as_range and not (is_integer(tokens) and 1 <= tokens <= MAX_NEW_TOKENS):
        raise ConfigError(f"{name} must be an integer 1 to {MAX_NEW_TOKENS:,} (as moestab train's), got "
                          f"{shown(tokens)}")
    check_at_least(name, tokens, 1)
    check_at_most(name, tokens, MAX_NEW_TOKENS, "beyond a response an RL step trains on")


NAME_MAX = 255
"""Longest file or folder name, in bytes (Linux and macOS file systems): a longer one fails with ENAMETOOLONG."""
PATH_MAX = 4096
"""Longest path, in bytes (Linux)."""


def check_path_lengths(name: str, path: str | None) -> None:
    """Each part of ``path`` fits in a file name, and the whole in a path (else the first write fails with a
    traceback, after the run has started)."""
    if path is None:
        return
    long = [part for part in Path(path).parts if len(os.fsencode(part)) > NAME_MAX]
    if long:
        raise ConfigError(f"{name}: the name {shown(long[0])} is {len(os.fsencode(long[0]))} bytes; file systems "
                          f"take names of at most {NAME_MAX}")
    if len(os.fsencode(str(Path(path).absolute()))) > PATH_MAX:
        raise ConfigError(f"{name}: the path is over {PATH_MAX} bytes long; give a shorter one")


CACHE_ENV = "MOESTAB_CACHE"
"""The environment variable naming moestab's cache folder (warm-started bases, the dashboard's run index)."""


def cache_root(folder: str | None = None) -> Path:
    """moestab's cache folder: ``folder``, else ``$MOESTAB_CACHE``, else ``~/.cache/moestab`` (not created here)."""
    return Path(folder or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "moestab")


def check_cache_dir(name: str, folder: str | None) -> None:
    """The warm-start cache: ``None`` (the default cache) or a folder that exists or can be created."""
    if folder is None:
        return
    problem = folder_problem(folder) if folder.strip() else "the value is empty"
    if problem:
        raise ConfigError(f"{name}: {problem}; give a folder (it is created if missing)")


def check_minibatches(name: str, counts: int | Sequence[int], batch: int, product: str) -> None:
    """Minibatches per RL step: each count an integer >= 1 dividing the rollout batch of ``batch`` sequences, so that
    every minibatch holds as many sequences (unequal ones would weigh sequences differently); the refusal lists the
    valid counts.

    ``counts``: one count (``moestab train``'s minibatches) or several, at least one (the step-volatility probe's
    minibatch_counts); ``product`` spells ``batch`` as the setting names it ('prompts_per_step*group_size = 32*8').
    """
    several = not isinstance(counts, int)
    listed = counts if several else [counts]
    bad = [n for n in listed if not is_integer(n) or n < 1 or batch % n]
    if not bad and listed:
        return
    batch_text = f"the rollout batch of {batch} sequences ({product}); valid: {divisors_text(batch)}"
    if several:
        raise ConfigError(f"{name} {shown(bad) if bad else '(none)'} are not valid: each must divide {batch_text}")
    raise ConfigError(f"{name}={counts} does not divide {batch_text}")


def divisors_text(n: int, shown_at_most: int = 24) -> str:
    """The divisors of ``n`` as 'a, b, c' for an error (the first and last ones when there are many)."""
    if n > 10**12:  # the search takes sqrt(n) steps
        return f"the divisors of {n}"
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    found = small + [n // d for d in reversed(small) if d * d != n]
    if len(found) > shown_at_most:
        half = shown_at_most // 2
        return ", ".join(map(str, found[:half])) + ", ..., " + ", ".join(map(str, found[-half:]))
    return ", ".join(map(str, found))

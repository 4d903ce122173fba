"""Findings that cannot drift: the numbers of docs/findings.md come from the executed notebooks' outputs.

A notebook publishes the numbers a finding quotes with :func:`show_findings`, which displays them as one output of
MIME type :data:`FINDINGS_MIME` (plus a readable text form). :func:`read_findings` reads every such output back from
an executed ``.ipynb``; :func:`render` fills a template whose placeholders name a notebook and a key,
``{{02:depth.token_router_ratio_16}}`` or with a format spec ``{{02:depth.routers_16:.1%}}``. The launcher
``scripts/findings.py`` renders ``docs/findings.template.md`` into ``docs/findings.md``; a test fails when the
committed file and the rendering of the committed notebooks differ.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FINDINGS_MIME = "application/vnd.moestab.findings+json"
"""The output MIME type that marks a notebook's published numbers."""

_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PLACEHOLDER = re.compile(r"\{\{\s*(?P<nb>[0-9]{2}):(?P<key>[A-Za-z0-9_.\-]+)(?::(?P<spec>[^}]*))?\s*\}\}")


class FindingsError(ValueError):
    """A published value or a template placeholder that does not fit."""


def _plain(key: str, value: Any) -> float | int | str | bool | None:
    if not _KEY.match(key):
        raise FindingsError(f"finding key {key!r} is not valid: use letters, digits and . _ - only")
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    raise FindingsError(f"finding {key!r} is a {type(value).__name__}; publish numbers, strings or booleans")


def findings_bundle(values: Mapping[str, Any]) -> dict[str, Any]:
    """The display bundle of ``values``: the JSON under :data:`FINDINGS_MIME` and one ``key = value`` line each."""
    clean = {key: _plain(key, value) for key, value in values.items()}
    text = "\n".join(f"{key} = {value!r}" for key, value in clean.items())
    return {FINDINGS_MIME: clean, "text/plain": text}


def show_findings(values: Mapping[str, Any]) -> None:
    """Display ``values`` in the running notebook as published findings (read back by :func:`read_findings`)."""
    from IPython.display import display

    display(findings_bundle(values), raw=True)


def notebook_id(path: str | Path) -> str:
    """``"02"`` for ``notebooks/02_volatility_vs_depth_and_lr.ipynb``: the two digits a placeholder names."""
    stem = Path(path).stem
    if not re.match(r"^[0-9]{2}_", stem):
        raise FindingsError(f"{path}: a notebook's name starts with two digits and an underscore (e.g. 02_name)")
    return stem[:2]


def read_findings(path: str | Path) -> dict[str, Any]:
    """Every value an executed notebook published (nbformat stores keys sorted); a key published twice is an error."""
    cells = json.loads(Path(path).read_text())["cells"]
    out: dict[str, Any] = {}
    for cell in cells:
        for output in cell.get("outputs", []):
            published = output.get("data", {}).get(FINDINGS_MIME)
            if published is None:
                continue
            for key, value in published.items():
                if key in out:
                    raise FindingsError(f"{path}: finding {key!r} is published twice")
                out[key] = value
    return out


def read_all(paths: Iterable[str | Path]) -> dict[str, dict[str, Any]]:
    """Notebook id -> its published values, for every executed notebook in ``paths``."""
    return {notebook_id(p): read_findings(p) for p in sorted(paths, key=lambda p: Path(p).name)}


def _format(value: Any, spec: str | None, where: str) -> str:
    if value is None:
        return "n/a"
    if not spec:
        return f"{value:.3g}" if isinstance(value, float) else str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError) as err:
        raise FindingsError(f"{where}: format spec {spec!r} does not apply to {value!r} ({err})") from err


def render(template: str, values: Mapping[str, Mapping[str, Any]]) -> str:
    """``template`` with every ``{{NN:key[:spec]}}`` replaced by notebook NN's published ``key`` (formatted with
    ``spec``; ``n/a`` for a published NaN or None). A placeholder naming a notebook or key that was not published is an
    error that lists what is there."""

    def fill(match: re.Match[str]) -> str:
        nb, key, spec = match["nb"], match["key"], match["spec"]
        where = match.group(0)
        if nb not in values:
            raise FindingsError(f"{where}: notebook {nb} published nothing; notebooks with findings: "
                                f"{', '.join(sorted(values)) or 'none'}")
        if key not in values[nb]:
            raise FindingsError(f"{where}: notebook {nb} did not publish {key!r}; it published: "
                                f"{', '.join(values[nb]) or 'nothing'}")
        return _format(values[nb][key], spec, where)

    rendered = _PLACEHOLDER.sub(fill, template)
    leftover = re.search(r"\{\{[^}]*\}\}", rendered)
    if leftover:
        raise FindingsError(f"placeholder {leftover.group(0)} is malformed: write {{{{NN:key}}}} or "
                            "{{NN:key:spec}}")
    return rendered

"""A registered design: the JSON block of a committed Markdown file that a launcher checks before it runs anything.

The block is the first fenced ```json block of the file; a launcher compares it with the design its code would run
and refuses on any difference, so what runs is what was registered before any of its runs existed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_OPEN, _CLOSE = "```json\n", "\n```"


class RegistrationError(RuntimeError):
    """A registration is missing, unreadable, or registers another design than the one that would run."""


def registered_block(path: str | Path) -> dict[str, Any]:
    """The JSON block of ``path``; :class:`RegistrationError` when there is no file or no block."""
    path = Path(path)
    if not path.is_file():
        raise RegistrationError(f"no registration at {path}; write and commit it first")
    text = path.read_text(encoding="utf-8")
    start = text.find(_OPEN)
    end = text.find(_CLOSE, start + len(_OPEN)) if start >= 0 else -1
    if end < 0:
        raise RegistrationError(f"{path} has no ```json block holding the registration")
    try:
        return json.loads(text[start + len(_OPEN):end])
    except json.JSONDecodeError as exc:
        raise RegistrationError(f"{path}: the registration block is not JSON ({exc})") from exc


def check_registered(path: str | Path, design: dict[str, Any]) -> None:
    """Refuse unless ``path`` registers exactly ``design`` (compared as JSON values), naming the differing keys."""
    registered = registered_block(path)
    expected = json.loads(json.dumps(design))
    differ = sorted(k for k in expected.keys() | registered.keys() if expected.get(k) != registered.get(k))
    if differ:
        raise RegistrationError(f"{path} registers another design than the one that would run (differing: "
                                f"{', '.join(differ)}); a registered design is not changed: register a new one, and "
                                "say why")


def block(design: dict[str, Any]) -> str:
    """The fenced JSON block of ``design``, as a registration file holds it."""
    return _OPEN + json.dumps(design, indent=1) + _CLOSE

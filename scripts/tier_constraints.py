"""Print the pip constraints of one CI test tier (scripts/test_tier.sh): read from pyproject.toml and constraints.txt,
so the tiers always test the range the project declares.

    python3 scripts/tier_constraints.py newest   # torch as locked; everything else the newest inside the range
    python3 scripts/tier_constraints.py oldest   # torch as locked; the ranged packages at their lower bounds
    python3 scripts/tier_constraints.py verl     # torch as locked; verl 0.9.1 at the lowest transformers both accept
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANGED = ("transformers", "pandas", "pyarrow", "streamlit", "trl")
"""The packages whose declared lower bound the oldest tier installs (torch stays on the locked CPU wheel)."""


def declared() -> dict[str, str]:
    """Every requirement of pyproject (dependencies and extras): ``{name: specifier}``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    out = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", requirement.strip())
        if match is None:
            raise SystemExit(f"pyproject.toml: cannot read the requirement {requirement!r}")
        if match.group(1).lower() != "moestab":  # an extra made of other extras ([all], [dev])
            out.setdefault(match.group(1).lower(), match.group(2))
    return out


def locked() -> dict[str, str]:
    """constraints.txt's pins: ``{name: version}``."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def lower_bound(specifier: str, name: str) -> str:
    match = re.search(r">=\s*([0-9][^,\s]*)", specifier)
    if match is None:
        raise SystemExit(f"pyproject.toml declares no lower bound (>=) for {name}: {specifier!r}")
    return match.group(1)


VERL = "0.9.1"
VERL_TRANSFORMERS = ">=5.5.3,<5.11,!=5.6.0"
"""verl 0.9.1's declared transformers range (its wheel's metadata, Requires-Dist)."""
VERL_TIER_TRANSFORMERS = "5.6.1"
"""The lowest transformers release both moestab and verl 0.9.1 accept (moestab's floor, 5.6.0, is one verl excludes);
checked against both ranges whenever the tier's pins are printed."""


def verl_transformers() -> str:
    """:data:`VERL_TIER_TRANSFORMERS`, after checking that both verl and pyproject accept it."""
    from packaging.specifiers import SpecifierSet

    for who, spec in ((f"verl {VERL}", VERL_TRANSFORMERS), ("moestab", declared()["transformers"])):
        if VERL_TIER_TRANSFORMERS not in SpecifierSet(spec):
            raise SystemExit(f"the verl tier's transformers {VERL_TIER_TRANSFORMERS} is outside {who}'s range {spec}: "
                             "pick the lowest release both accept")
    return VERL_TIER_TRANSFORMERS


def tier_pins(tier: str) -> list[str]:
    pins = [f"torch=={locked()['torch']}"]
    specs = declared()
    if tier == "oldest":
        pins += [f"{name}=={lower_bound(specs[name], name)}" for name in RANGED]
    elif tier == "verl":
        pins += [f"verl=={VERL}", f"transformers=={verl_transformers()}", f"trl=={lower_bound(specs['trl'], 'trl')}"]
    return pins


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("newest", "oldest", "verl"):
        raise SystemExit("usage: python3 scripts/tier_constraints.py newest|oldest|verl")
    print("\n".join(tier_pins(sys.argv[1])))

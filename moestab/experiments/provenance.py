"""Which code produced a registered experiment's runs: one commit, or commits declared the same run for run.

A manifest (:func:`moestab.experiments.powered.manifest`) lists each run's ``commit`` and ``dirty`` from run.json.
Runs of one experiment may span commits only where the code's change was shown not to change a run: ``python
scripts/same_run.py RUN_A RUN_B --declare FILE`` compares two runs of the same config written by two commits, bit for
bit, and on success appends the pair of commits to ``FILE`` (:data:`DECLARATION_COLUMNS`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

DECLARATION_COLUMNS = ("commit_a", "commit_b", "run_a", "run_b", "checked")
"""A declaration's row: the two commits, the two run folders ``same_run.py`` found identical, and when."""


def read_declarations(path: str | Path) -> pd.DataFrame:
    """The declarations of ``path`` (none when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame(columns=list(DECLARATION_COLUMNS))
    table = pd.read_csv(path, dtype=str)
    missing = [c for c in DECLARATION_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: columns {missing} missing; a declaration has {list(DECLARATION_COLUMNS)}")
    return table


def _linked(commits: set[str], declared: pd.DataFrame) -> list[set[str]]:
    """The commits grouped by declared sameness (connected components of the declared pairs)."""
    groups = [{c} for c in commits]
    for a, b in zip(declared["commit_a"], declared["commit_b"], strict=True):
        ga = next((g for g in groups if a in g), None)
        gb = next((g for g in groups if b in g), None)
        if ga is not None and gb is not None and ga is not gb:
            ga |= gb
            groups.remove(gb)
    return groups


def commit_problems(table: pd.DataFrame, declared: pd.DataFrame | None = None) -> list[str]:
    """What a manifest's provenance gets wrong: a run with no commit on record, a run written from a modified tree,
    or runs of more than one commit that no declaration (``same_run.py --declare``) links."""
    problems = []
    commits = [c.strip() if isinstance(c, str) and c.strip() else None for c in table["commit"]]
    for run, commit, dirty in zip(table["run"], commits, table["dirty"], strict=True):
        if commit is None:
            problems.append(f"{run}: no commit on record (written before moestab recorded it, or from a wheel)")
        elif str(dirty).lower() in ("true", "1"):
            problems.append(f"{run}: written from a modified tree at {commit}: the commit does not name its code")
    known = {c for c in commits if c is not None}
    groups = _linked(known, declared if declared is not None else pd.DataFrame(columns=list(DECLARATION_COLUMNS)))
    if len(groups) > 1:
        names = "; ".join(", ".join(sorted(c[:12] for c in g)) for g in groups)
        problems.append(f"the runs mix commits that no declaration links ({names}); show a run is the same with "
                        "`python scripts/same_run.py RUN_A RUN_B --declare FILE`, or re-run on one commit")
    return problems

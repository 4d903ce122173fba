"""Delete what a run no longer needs, as the trainer now does after every checkpoint: all but the two newest
training states (older checkpoints keep their weights) and ``--base-refresh-every``'s refresh-only checkpoints no
kept state resumes from (moestab.train.checkpoint.superseded_checkpoints). For run folders written before moestab
pruned them (a K = 1 run of issue 52 kept 101 checkpoints and states, 7.7 GB).

    python scripts/prune_runs.py RUN_OR_RUNS_DIR [...] [--dry-run] [--refresh-checkpoints]

By default only training states go (all but the two newest checkpoints'), which is right whatever settings the run
was resumed with. ``--refresh-checkpoints`` also deletes refresh-only checkpoints whole, judging them by run.json's
save_every and steps: a run resumed with other values (run.json keeps the first) may lose a checkpoint it saved by
those, so check ``--dry-run`` first. A run another process is writing is skipped (its lock is held), and so is one
whose subfolders are links (a shared runs folder: deleting through a link would delete its target's files); nothing
read by an analysis (metrics, per-token tables, the kept checkpoints' weights) is touched.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from moestab.analysis.dashboard_data import find_runs
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError
from moestab.train.checkpoint import prune_checkpoints, superseded_checkpoints


def run_folders(paths: list[Path]) -> list[Path]:
    """Each path that holds a run, and the run folders under each that does not (the dashboard's search)."""
    return [run for path in paths for run in find_runs(path, max_depth=6)]


def _settings(folder: RunFolder, refresh_checkpoints: bool) -> dict[str, int]:
    config = folder.info().config
    settings = {"save_every": config.get("save_every"), "steps": config.get("steps"),
                "refresh_every": config.get("base_refresh_every", 0)}
    bad = {k: v for k, v in settings.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0}
    if bad or settings["save_every"] == 0:
        raise RunError(f"{folder.path / schema.RUN_JSON}: config {bad or settings} is not a run's (integers >= 0, "
                       "save_every >= 1); nothing was deleted")
    if not refresh_checkpoints:
        settings["refresh_every"] = 0  # training states only
    return settings


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, or folders holding them")
    parser.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    parser.add_argument("--refresh-checkpoints", action="store_true",
                        help="also delete --base-refresh-every's refresh-only checkpoints whole (judged by run.json)")
    args = parser.parse_args(argv)
    freed = 0
    for path in run_folders(args.paths):
        folder = RunFolder(path)
        try:
            folder.refuse_links()
            with folder.lock(note=print):
                settings = _settings(folder, args.refresh_checkpoints)
                whole, states = superseded_checkpoints(folder.saved_checkpoints(), folder.complete_checkpoints(),
                                                       **settings)
                size = (sum(_size(folder.checkpoint_dir(s)) + _size(folder.state_file(s)) for s in whole)
                        + sum(_size(folder.state_file(s)) for s in states))
                if not args.dry_run:
                    prune_checkpoints(folder, **settings)
        except (RunError, OSError) as exc:  # being written (its lock held), a planted link, not a run, not writable
            print(f"skipped {path}: {exc}")
            continue
        freed += size
        print(f"{path}: {len(whole)} checkpoints whole, {len(states)} training states, {size / 2**20:.0f} MiB")
    verb = "would free" if args.dry_run else "freed"
    print(f"{verb} {freed / 2**30:.2f} GiB; {shutil.disk_usage(args.paths[0]).free / 2**30:.1f} GiB free now")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

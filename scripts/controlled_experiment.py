"""Issue 26's controlled experiment (moestab.experiments.controlled; docs/controlled.md), stage by stage.

    .venv/bin/python scripts/controlled_experiment.py scan --out runs/controlled
    .venv/bin/python scripts/controlled_experiment.py choose --out runs/controlled   # writes docs/preregistration.md
    git add docs/preregistration.md && git commit -m "Pre-register the controlled experiment"
    nohup .venv/bin/python scripts/controlled_experiment.py evaluate --out runs/controlled > evaluate.log 2>&1 &
    (or two processes, one per core: taskset -c 0 ... evaluate --shard 0/2 & taskset -c 1 ... evaluate --shard 1/2 &)
    .venv/bin/python scripts/controlled_experiment.py report --out runs/controlled --dest docs/controlled_results

scan and evaluate resume from finished runs: rerun the same command after an interruption. evaluate refuses to start
unless the pre-registration exists, is committed (--no-git-check skips this) and registers what it would run.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
from pathlib import Path

from moestab.experiments import controlled


def _committed(path: Path) -> str | None:
    """Why ``path`` is not committed as it is, or None when it is (or is missing: `evaluate` then says so)."""
    if not path.is_file():
        return None
    where = ["git", "-C", str(path.parent.resolve())]
    tracked = subprocess.run([*where, "ls-files", "--error-unmatch", path.name], capture_output=True)
    if tracked.returncode:
        return f"{path} is not committed: commit the pre-registration before evaluating"
    changed = subprocess.run([*where, "diff", "--quiet", "HEAD", "--", path.name], capture_output=True)
    return f"{path} has uncommitted changes" if changed.returncode else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=("scan", "choose", "evaluate", "report"))
    parser.add_argument("--out", type=Path, default=Path("runs/controlled"), help="the experiment's run folders")
    parser.add_argument("--prereg", type=Path, default=Path("docs/preregistration.md"))
    parser.add_argument("--dest", type=Path, default=Path("docs/controlled_results"), help="report: output folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run (registered)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--shard", default="0/1", help="evaluate: I/N runs every N-th run from the I-th (0-based), "
                        "so N processes, each on its own core, share the evaluation; default 0/1: every run")
    parser.add_argument("--no-git-check", action="store_true", help="evaluate: allow an uncommitted pre-registration")
    args = parser.parse_args(argv)
    plan = controlled.Plan(threads=args.threads, cache_dir=args.cache_dir)
    log = lambda line: print(line, flush=True)  # noqa: E731
    if args.stage in ("scan", "evaluate"):
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(args.threads)
    if args.stage == "scan":
        controlled.run_scan(plan, args.out, log=log)
    elif args.stage == "choose":
        table = controlled.scan_table(plan, args.out)
        args.prereg.write_text(controlled.preregistration_markdown(plan, table, datetime.date.today().isoformat()))
        log(f"wrote {args.prereg} (chosen lr {controlled.choose_lr(table)}); commit it before `evaluate`")
    elif args.stage == "evaluate":
        problem = None if args.no_git_check else _committed(args.prereg)
        if problem:
            raise SystemExit(problem)
        index, _, count = args.shard.partition("/")
        if not (index.isdigit() and count.isdigit()):
            raise SystemExit(f"--shard {args.shard!r} is not valid: give I/N, e.g. 0/2 and 1/2 for two processes")
        controlled.run_evaluation(plan, args.out, args.prereg, log=log, shards=(int(index), int(count)))
    else:
        for path in controlled.write_report(plan, args.out, args.prereg, args.dest):
            log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 41's precondition search (moestab.experiments.precondition; docs/precondition.md).

    .venv/bin/python scripts/precondition_search.py plan                     # the settings, their estimated cost
    .venv/bin/python scripts/precondition_search.py register                 # the registration block to commit
    .venv/bin/python scripts/precondition_search.py run --out runs/issue41/precondition --cache-dir C
    .venv/bin/python scripts/precondition_search.py table --out runs/issue41/precondition   # settings finished so far

``run`` refuses unless docs/precondition.md registers exactly this search; finished runs are reused, so it resumes
after any stop. Two processes may run it at once (each trains what the other has not taken: the run folders' locks).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moestab.experiments import precondition as pre
from moestab.experiments.grid import quiet_process
from moestab.experiments.registration import block

ROOT = Path(__file__).resolve().parents[1]
REGISTRATION = ROOT / "docs" / "precondition.md"


def _table(rows: list[dict]) -> str:
    head = ("setting", "model", "aux", "task", "lr", "vol", "vol_by_seed", "control_stable", "passes", "core_hours")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["setting"], r["model"], r["warm_start_aux_loss_coef"], r["task"], r["lr"], f"{r['vol']:.2%}",
                 ", ".join(f"{v:.2%}" for v in r["vol_by_seed"]), r["control_stable"], r["passes"],
                 f"{r['core_hours']:.2f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    by_layer = [f"- {r['setting']}: old->new changed by layer " + ", ".join(f"{v:.1%}" for v in r["vol_by_layer"])
                for r in rows]
    return "\n".join([*lines, "", *by_layer])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("plan", "register", "run", "table"))
    parser.add_argument("--out", type=Path, default=Path("runs/issue41/precondition"))
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    settings = pre.SETTINGS
    if args.command == "plan":
        for s in settings:
            print(f"{s.name}: {s.fields()}, ~{s.core_hours():.2f} core-hours")
        print(f"total if every setting runs: {sum(s.core_hours() for s in settings):.2f} core-hours; "
              f"budget {pre.BUDGET_CORE_HOURS}")
        return 0
    if args.command == "register":
        print(block(pre.registration(settings)))
        return 0
    if args.command == "run":
        pre.check_registration(REGISTRATION, settings)
        quiet_process(1)
    rows = pre.search(settings, args.out, extra=pre.base_fields(cache_dir=args.cache_dir), dry=args.command == "table",
                      log=lambda line: print(line, flush=True))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""README's probe examples, over the default job's seeds: what `moestab probe numerics RUN --suite task:arithmetic`
and `moestab probe saturation RUN --suite task:arithmetic --count 64` give on each seed's run, as seed 0 (the run
the main command makes) beside the mean +- sd over seeds, in the Markdown tables README shows.

    .venv/bin/python scripts/probe_examples.py --runs runs/readme/default [--seeds 0 1 2 ...] [--threads 2]
        [--figure docs/images/probe_numerics_flips.png]

``--runs`` holds ``gspo-off-seed{N}`` folders (``scripts/default_run_stats.py --out``). The probes are the CLI's
(``moestab.probes.runner.probe_inputs`` / ``run_probe``) with their default settings; both forwards are float32
(numerics: against bfloat16, and batched against one sequence at a time).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

BF16 = "bfloat16 vs float32 (batch 16)"
ONE_AT_A_TIME = "one sequence at a time vs batch 16 (float32)"
NUMERICS_ROWS = (
    # (label, comparison, function of the probe's tables -> value, format)
    ("bf16 vs fp32: routers flipped", BF16, lambda t, c: 100 * _summary(t, c)["router_flip"], "{:.2f}%"),
    ("bf16 vs fp32: tokens with >= 1 flipped layer", BF16, lambda t, c: 100 * _summary(t, c)["token_flip"],
     "{:.1f}%"),
    ("bf16 vs fp32: k3", BF16, lambda t, c: _summary(t, c)["k3"], "{:.1e}"),
    ("bf16 vs fp32: share of flips in the lowest router-margin decile", BF16,
     lambda t, c: 100 * _lowest_decile_share(t, c), "{:.0f}%"),
    ("one sequence at a time vs batched (fp32): routers flipped", ONE_AT_A_TIME,
     lambda t, c: 100 * _summary(t, c)["router_flip"], "{:.2f}%"),
    ("one sequence at a time vs batched (fp32): k3", ONE_AT_A_TIME, lambda t, c: _summary(t, c)["k3"], "{:.0e}"),
)


def _summary(tables: dict[str, pd.DataFrame], comparison: str) -> pd.Series:
    summary = tables["summary"]
    return summary[summary["comparison"] == comparison].iloc[0]


def _lowest_decile_share(tables: dict[str, pd.DataFrame], comparison: str) -> float:
    margin = tables["by_margin"]
    rows = margin[margin["comparison"] == comparison]
    flipped = rows["flipped"].sum()
    return float(rows[rows["bin"] == 0]["flipped"].sum() / flipped) if flipped else float("nan")


def _figure(result, path: Path) -> None:
    import shutil
    import tempfile

    from moestab.probes.plots import plot_probe

    with tempfile.TemporaryDirectory() as folder:
        drawn = [p for p in plot_probe(result, folder) if p.name == "numerics_flips.png"]
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(drawn[0], path)


def mean_sd(xs: list[float], fmt: str) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
    return f"{fmt.format(statistics.mean(xs))} +- {fmt.format(sd)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs/readme/default"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--count", type=int, default=64, help="suite texts of the saturation probe (README's)")
    parser.add_argument("--figure", type=Path, default=None,
                        help="write the first seed's numerics figure (what --plots draws) to this PNG")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import torch

    torch.set_num_threads(args.threads)
    from moestab.probes.runner import ProbeSettings, probe_inputs, run_probe

    numerics: dict[str, list[float]] = {label: [] for label, *_ in NUMERICS_ROWS}
    saturation = []
    for seed in args.seeds:
        run = args.runs / f"gspo-off-seed{seed}"
        if not (run / "run.json").is_file():
            raise SystemExit(f"{run} is not a run folder: make the runs first (scripts/default_run_stats.py --out "
                             f"{args.runs})")
        checkpoints, suite = probe_inputs("numerics", [str(run)], "task:arithmetic", None, ProbeSettings())
        result = run_probe("numerics", checkpoints, suite, ProbeSettings())
        tables = result.tables
        if args.figure is not None and seed == args.seeds[0]:
            _figure(result, args.figure)
        for label, comparison, get, _ in NUMERICS_ROWS:
            numerics[label].append(float(get(tables, comparison)))
        checkpoints, suite = probe_inputs("saturation", [str(run)], "task:arithmetic", args.count, ProbeSettings())
        frame = run_probe("saturation", checkpoints, suite, ProbeSettings()).tables["saturation"]
        frame["step"] = frame["checkpoint"].str.rsplit("@", n=1).str[1].astype(int)
        saturation.append(frame.assign(seed=seed))
        print(f"seed {seed}: {run}", flush=True)

    first = args.seeds[0]
    print(f"\nseeds {', '.join(map(str, args.seeds))}; {args.threads} torch threads; the last checkpoint of each run; "
          "suite task:arithmetic")
    print(f"\n| `moestab probe numerics` | seed {first} | mean +- sd over seeds |\n|---|---|---|")
    for label, _, _, fmt in NUMERICS_ROWS:
        xs = numerics[label]
        print(f"| {label} | {fmt.format(xs[0])} | {mean_sd(xs, fmt)} |")

    frames = pd.concat(saturation, ignore_index=True)
    layers = sorted(frames["layer"].unique())
    print(f"\n| `moestab probe saturation --count {args.count}`: top-k saturation against the last checkpoint, seed "
          f"{first} (mean +- sd over seeds) | " + " | ".join(f"layer {j}" for j in layers) + " |")
    print("|---|" + "---|" * len(layers))
    for step, rows in frames.groupby("step"):
        cells = []
        for j in layers:
            at = rows[rows["layer"] == j]
            own = float(at[at["seed"] == first]["saturation"].iloc[0])
            cells.append(f"{own:.3f} ({mean_sd(at['saturation'].astype(float).tolist(), '{:.3f}')})")
        print(f"| step {step} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the controlled experiment (docs/controlled.md) could detect: per arm, the minimum detectable difference in
final accuracy against MoE GRPO off, from the committed report's paired sd.

    .venv/bin/python scripts/controlled_power.py [--paired docs/controlled_results/paired.csv] [--alpha 0.05]
                                                 [--power 0.8] [--effect 0.10]

The design is the registered one: paired by seed, n seeds per arm, the two-sided 95% t-interval of the paired
differences (``moestab.metrics.paired``). The minimum detectable difference is the true mean difference that the
two-sided test at ``--alpha`` detects with probability ``--power`` given the measured paired sd
(``min_detectable_difference``, the noncentral t); beside it, the power for a difference of ``--effect``. This reads
the registered analysis' output and changes nothing in it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from moestab.metrics.paired import min_detectable_difference, paired_power

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paired", type=Path, default=ROOT / "docs" / "controlled_results" / "paired.csv",
                        help="the report's paired differences (controlled_experiment.py report)")
    parser.add_argument("--outcome", default="final_acc", help="the outcome whose differences are read")
    parser.add_argument("--alpha", type=float, default=0.05, help="two-sided level of the test")
    parser.add_argument("--power", type=float, default=0.8, help="power at the minimum detectable difference")
    parser.add_argument("--effect", type=float, default=0.10, help="a difference whose power is printed too")
    args = parser.parse_args(argv)
    paired = pd.read_csv(args.paired)
    rows = paired[paired.outcome == args.outcome]
    if rows.empty:
        raise SystemExit(f"{args.paired} has no rows for outcome {args.outcome!r}; it has: "
                         f"{', '.join(sorted(paired.outcome.unique()))}")
    print(f"{args.outcome}, arm - moe_grpo_off, paired by seed; two-sided alpha {args.alpha:g}, power {args.power:g}")
    print(f"{'arm':<18} {'n':>2} {'paired sd':>10} {'MDE':>8} {'power at ' + f'{args.effect:g}':>14}")
    for row in rows.itertuples():
        mde = min_detectable_difference(row.sd_diff, int(row.n), args.alpha, args.power)
        power = paired_power(args.effect, row.sd_diff, int(row.n), args.alpha)
        print(f"{row.arm:<18} {row.n:>2} {row.sd_diff:>10.4f} {mde:>8.4f} {power:>14.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

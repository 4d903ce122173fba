"""Write docs/families.md: every MoE family moestab supports, measured on a tiny model of it, and the ones it refuses.

    .venv/bin/python scripts/families_table.py            # writes docs/families.md (~1 min on 2 cores)
    .venv/bin/python scripts/families_table.py --check    # exit 1 when docs/families.md lists other families

The measurements are moestab.models.conformance's, the same the tests assert on (tests/routing/test_all_families.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "families.md"


def render(reports, unsupported, version: str, seconds: float, floors: dict[str, str], lowest: str) -> str:
    lines = [
        "# MoE families",
        "",
        f"Every decoder MoE family of transformers {version} whose router picks a top-k of experts per token, measured "
        "by `moestab.models.conformance` on a tiny float64 model of it (2 MoE layers, 8 experts, top-2; a dense first "
        "layer where the family has one; a hybrid stack where it is one). Regenerate with "
        "`.venv/bin/python scripts/families_table.py` "
        f"({seconds:.0f} s on this machine); tests/routing/test_all_families.py asserts the same measurements. "
        "The per-family tests ran in 15 s (121 tests, 2 cores: `.venv/bin/python -m pytest "
        "tests/routing/test_all_families.py tests/routing/test_gating.py tests/train/test_train_families.py`), well "
        "inside CI's budget.",
        "",
        "Columns: *selection* what the router ranks; *gates* how the chosen experts are weighted; *MoE layers* of the "
        "decoder layers; *replay diff* max |logit| difference between a free forward and the replay of its own routes "
        "(exactly 0 = bitwise); *other routes* the same against replayed other routes (> 0: replay forces); "
        "*router grad* max difference of the router's gradient under replay vs free (its norm in brackets: the "
        "router still learns under replay); *generate* share of router decisions that differ between `generate()` "
        "with a KV cache and one full forward; *from transformers* the oldest release whose router moestab's adapter "
        f"matches (`RouterAdapter.min_transformers`; on an older one the family is refused at load), where that is "
        f"newer than pyproject's lower bound, {lowest} (docs/versions.md: found by running these tests at each "
        "release).",
        "",
        "| family | router | selection | gates | MoE layers | replay diff | other routes | router grad | generate "
        "| from transformers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        layers = f"{list(r.moe_layers)} of {r.num_layers}"
        replay = "0 (bitwise)" if r.replay_bitwise else f"{r.replay_max_diff:.1e}"
        lines.append(f"| {r.family} | `{r.router}` | {r.selection} | {r.gating} | {layers} | {replay} | "
                     f"{r.replay_other_diff:.2g} | {r.grad_max_diff:.1g} ({r.grad_norm:.2g}) | "
                     f"{r.generate_mismatch:.0%} | {floors.get(r.family) or lowest} |")
    lines += [
        "",
        "Notes: PhiMoE's SparseMixer samples experts with Gumbel noise in training mode, so replay is exact in eval "
        "mode only (`RoutingReplay` refuses a PhiMoE model in training mode, and `moestab train` refuses "
        "`--routing-replay` other than `off` for it). GLM-MoE-DSA and DeepSeek-V3.2 are measured with their sparse-"
        "attention indexer keeping every key (`index_topk` above the sequence length), since their cached and full "
        "forwards attend to different keys otherwise. Granite-MoE-SWA's own free forward gives NaN logits for a "
        "left-padded row in transformers " + version + ", so the table's batches are right-padded.",
        "",
        "## Refused",
        "",
        "These MoE families are recognised and refused with the reason (`UnsupportedRoutingError`), never "
        "approximated:",
        "",
        "| family | module | why |",
        "|---|---|---|",
    ]
    lines += [f"| {u.family} | `{u.module_class}` | {u.reason} |" for u in unsupported]
    lines += [
        "",
        "Families not listed: multimodal wrappers whose text decoder is listed under its own model type (e.g. "
        "`qwen3_5_moe` -> `qwen3_5_moe_text`, `llama4` -> `llama4_text`, `aria` -> `aria_text`); moestab trains "
        "causal LMs built with `AutoModelForCausalLM`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check the families listed in docs/families.md")
    args = parser.parse_args(argv)
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from moestab.models.conformance import family_report
    from moestab.routing.adapters import ADAPTERS, SUPPORTED_FAMILIES, UNSUPPORTED
    from moestab.routing.compat import TESTED_TRANSFORMERS

    if args.check:
        text = DOC.read_text(encoding="utf-8")
        listed = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")} - {"family"}
        expected = set(SUPPORTED_FAMILIES) | {u.family for u in UNSUPPORTED}
        if listed != expected:
            print(f"docs/families.md is stale: missing {sorted(expected - listed)}, extra {sorted(listed - expected)}")
            return 1
        shown = {cells[1].strip(): cells[-2].strip() for line in text.splitlines()
                 if line.startswith("| ") and len(cells := line.split("|")) == 12}
        wanted = {a.family: a.min_transformers or TESTED_TRANSFORMERS[0] for a in ADAPTERS}
        if {f: shown.get(f) for f in wanted} != wanted:
            print("docs/families.md is stale: its 'from transformers' column differs from the adapters' floors")
            return 1
        return 0
    hf_logging.set_verbosity_error()
    torch.set_num_threads(2)
    start = time.perf_counter()
    reports = []
    for family in SUPPORTED_FAMILIES:
        reports.append(family_report(family))
        print(f"{family}: measured", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    floors = {a.family: a.min_transformers for a in ADAPTERS}
    lowest = TESTED_TRANSFORMERS[0]
    DOC.write_text(render(reports, UNSUPPORTED, transformers.__version__, seconds, floors, lowest), encoding="utf-8")
    print(f"wrote {DOC} ({len(reports)} families, {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 26's controlled experiment: does routing volatility destabilise token-level GRPO on an MoE, and does Routing
Replay fix it? (docs/controlled.md; the launcher is scripts/controlled_experiment.py)

Four stages, each reading the run folders the one before wrote:

1. **scan** (reserved seeds, never evaluated): every lr of the plan x the two controls without routing change (the
   dense policy and the MoE with frozen routers, both GRPO without replay);
2. **choose**: the largest lr at which both controls are stable (:func:`is_stable`) on every reserved seed, written
   with the whole evaluation plan to the pre-registration (committed before stage 3);
3. **evaluate** (fresh seeds): the six arms of :data:`EVAL_ARMS` at the chosen lr; refuses to start unless the
   pre-registration exists and registers exactly what it would run;
4. **report**: per-seed outcomes and paired differences against MoE GRPO without replay, with 95% t-intervals.

Every run shares the base settings of :meth:`Plan.base`: bf16 rollouts against the fp32 trainer (so the rollout
engine's routing differs from the trainer's and R3 differs from R2), routing's share of the ratio measured every
update, and no stop on zero-advantage steps (a collapse is the measurement).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from moestab.experiments.grid import GridRun, grid_metrics, grid_runs, is_finished, run_grid, shard
from moestab.experiments.stability import run_stability
from moestab.metrics import keys
from moestab.metrics.collapse_warning import COLLAPSE_DROP
from moestab.metrics.paired import paired_interval
from moestab.run_folder.reader import load_metrics

logger = logging.getLogger(__name__)
"""The experiment's notes when :func:`run_scan` / :func:`run_evaluation` are given no ``log``."""

STABILITY_RULE = (f"a run is stable when its final eval accuracy is not more than COLLAPSE_DROP = {COLLAPSE_DROP} "
                  "below its start (run_stability's collapse is 0) and its reward_gain (mean reward of the last "
                  "quarter of the steps minus the first quarter) is >= 0")
"""The scan's stability criterion, fixed before any run (measures: ``stability.run_stability``)."""


def is_stable(measures: dict[str, float | None]) -> bool:
    """:data:`STABILITY_RULE` on one run's :func:`run_stability` measures (an unknown start or end is not stable)."""
    if measures["start_acc"] is None or measures["final_acc"] is None:
        return False
    gain = measures["reward_gain"]
    return measures["collapse"] == 0.0 and gain is not None and gain >= 0.0  # a NaN gain is not >= 0


@dataclass(frozen=True)
class Arm:
    """One arm: the policy (the MoE, its dense control, or the MoE with frozen routers) and the objective."""

    name: str
    algo: str
    replay: str
    dense: bool = False
    freeze_router: bool = False

    def fields(self, model_keys: str) -> dict[str, Any]:
        """TrainConfig fields of this arm; ``model_keys`` are the spec keys every arm shares (``layers=8``)."""
        model = f"embedded:dense,{model_keys}" if self.dense else f"embedded:{model_keys}"
        return {"model": model, "algo": self.algo, "routing_replay": self.replay, "freeze_router": self.freeze_router}


ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    Arm("moe_grpo_off", "grpo", "off"),
    Arm("moe_grpo_r2", "grpo", "old"),
    Arm("moe_grpo_r3", "grpo", "rollout"),
    Arm("moe_gspo_off", "gspo", "off"),
    Arm("dense_grpo_off", "grpo", "off", dense=True),
    Arm("frozen_grpo_off", "grpo", "off", freeze_router=True),
)}
SCAN_ARMS = ("dense_grpo_off", "frozen_grpo_off")
"""The controls whose stability picks the lr: neither has routing that changes during RL."""
EVAL_ARMS = tuple(ARMS)
BASELINE = "moe_grpo_off"
"""Every paired difference is an arm minus this arm on the same seed."""
OUTCOMES = ("final_acc", "reward_gain", "collapse", "routing_share", "ratio_log_var", "vol")
"""Per-run outcomes of the report: run_stability's, plus ``routing_share`` the step mean of routing_share/var_share."""
PRIMARY = "final_acc"


@dataclass(frozen=True)
class Plan:
    """The experiment's fixed settings (its defaults are the registered experiment; tests shrink them)."""

    layers: int = 8
    """Decoder layers of every arm's policy (configs/stress.yaml's 8-layer embedded policy)."""
    hidden: int | None = None
    """Residual width of every arm's policy; None: the embedded default."""
    task: str = "arithmetic"
    scan_lrs: tuple[float, ...] = (2e-4, 5e-4, 1e-3, 2e-3)
    scan_seeds: tuple[int, ...] = (900, 901)
    """Reserved for the scan: never evaluated."""
    scan_steps: int = 60
    scan_eval_every: int = 10
    eval_seeds: tuple[int, ...] = (1000, 1001, 1002, 1003, 1004)
    eval_steps: int = 100
    eval_every: int = 5
    extra: tuple[tuple[str, Any], ...] = ()
    """Further TrainConfig fields of every run (tests: tiny batches); registered with the rest."""
    threads: int = 1
    """Torch threads of every run (registered: float results depend on it). One, so that the experiment holds one core
    of a 2-core machine and other work the other: two threads slowed 4-5x whenever anything else ran (measured on the
    scan: 1.0 s per step alone, 3.5-5 s beside a test run)."""
    warm_start_aux_loss_coef: float = 0.0
    """The warm start's load-balancing coefficient. The registered experiment ran before the warm start had one (0);
    a registration leaves it out when 0, as registrations made before the setting do."""
    cache_dir: str | None = field(default=None, compare=False)
    """Where warm-started bases are cached (not part of the registered setting)."""

    def __post_init__(self) -> None:
        if set(self.scan_seeds) & set(self.eval_seeds):
            raise ValueError(f"scan seeds {self.scan_seeds} and evaluation seeds {self.eval_seeds} overlap: the scan's "
                             "seeds are reserved and never evaluated")
        if not self.scan_lrs:
            raise ValueError("scan_lrs is empty; give at least one lr")

    @property
    def model_keys(self) -> str:
        return f"layers={self.layers}" + (f",hidden={self.hidden}" if self.hidden else "")

    def base(self) -> dict[str, Any]:
        """TrainConfig fields every run shares."""
        return {"task": self.task, "rollout_dtype": "bfloat16", "routing_share": True, "max_zero_advantage_steps": 0,
                "threads": self.threads, "warm_start_aux_loss_coef": self.warm_start_aux_loss_coef,
                "cache_dir": self.cache_dir, **dict(self.extra)}


def _arm_runs(plan: Plan, arm: str, lrs: Sequence[float], seeds: Sequence[int], steps: int, eval_every: int,
              out: Path) -> list[GridRun]:
    fields = {**plan.base(), **ARMS[arm].fields(plan.model_keys), "steps": steps, "eval_every": eval_every}
    return grid_runs(fields, {"lr": list(lrs)}, seeds, out / arm)


def scan_runs(plan: Plan, out: str | Path) -> list[GridRun]:
    """The scan's runs, in ``out/scan/<arm>/lr-<lr>_seed-<seed>``."""
    return [run for arm in SCAN_ARMS for run in _arm_runs(plan, arm, plan.scan_lrs, plan.scan_seeds, plan.scan_steps,
                                                           plan.scan_eval_every, Path(out) / "scan")]


def evaluation_runs(plan: Plan, lr: float, out: str | Path) -> list[GridRun]:
    """The evaluation's runs at ``lr``, in ``out/evaluate/<arm>/lr-<lr>_seed-<seed>``."""
    return [run for arm in EVAL_ARMS for run in _arm_runs(plan, arm, [lr], plan.eval_seeds, plan.eval_steps,
                                                           plan.eval_every, Path(out) / "evaluate")]


def _arm_of(run: GridRun) -> str:
    return run.run_dir.parent.name


def _require_finished(runs: Sequence[GridRun], stage: str) -> None:
    missing = [str(r.run_dir) for r in runs if not is_finished(r)]
    if missing:
        raise RuntimeError(f"{len(missing)} {stage} run(s) have not finished, e.g. {missing[0]}; run the {stage} "
                           "stage first (it resumes from finished runs)")


def run_scan(plan: Plan, out: str | Path, *, log: Callable[[str], None] = logger.info) -> list[Path]:
    return run_grid(scan_runs(plan, out), log=log)


def scan_table(plan: Plan, out: str | Path) -> pd.DataFrame:
    """One row per scan run: arm, lr, seed, start and final accuracy, reward_gain, collapse, stable."""
    runs = scan_runs(plan, out)
    _require_finished(runs, "scan")
    rows = []
    for run in runs:
        m = run_stability(run.run_dir)
        measures = {k: m[k] for k in ("start_acc", "final_acc", "reward_gain", "collapse")}
        rows.append({"arm": _arm_of(run), "lr": run.values["lr"], "seed": run.values["seed"], **measures,
                     "stable": is_stable(m)})
    return pd.DataFrame(rows)


def choose_lr(table: pd.DataFrame) -> float:
    """The largest lr at which every scan run (both controls, every reserved seed) is stable."""
    stable = table.groupby("lr")["stable"].all()
    if not stable.any():
        raise RuntimeError(f"no lr of the scan {sorted(table['lr'].unique())} is stable for both controls on every "
                           f"reserved seed ({STABILITY_RULE}); scan lower lrs")
    return float(stable[stable].index.max())


def registration(plan: Plan, lr: float) -> dict[str, Any]:
    """What the evaluation runs, as JSON values: the registered setting that `evaluate` checks."""
    base = {k: v for k, v in plan.base().items()
            if k != "cache_dir" and not (k == "warm_start_aux_loss_coef" and v == 0.0)}
    registered = {
        "lr": lr, "base": base, "seeds": list(plan.eval_seeds), "steps": plan.eval_steps,
        "eval_every": plan.eval_every,
        "arms": {name: ARMS[name].fields(plan.model_keys) for name in EVAL_ARMS},
        "baseline": BASELINE, "primary_outcome": PRIMARY, "outcomes": list(OUTCOMES),
        "scan": {k: v for k, v in asdict(plan).items() if k.startswith("scan_")}, "stability_rule": STABILITY_RULE,
    }
    return json.loads(json.dumps(registered))  # tuples -> lists: compared with what the file holds


_BLOCK = re.compile(r"```json registration\n(.*?)\n```", re.DOTALL)


def preregistration_markdown(plan: Plan, table: pd.DataFrame, today: str) -> str:
    """docs/preregistration.md: the scan table, the chosen lr, the evaluation plan, the analysis and the date."""
    lr = choose_lr(table)
    reg = registration(plan, lr)
    return _PREREG.format(
        date=today, rule=STABILITY_RULE, lr=lr, layers=plan.layers, seeds=", ".join(map(str, plan.eval_seeds)),
        steps=plan.eval_steps, eval_every=plan.eval_every, arms=_arms_table(plan), baseline=BASELINE,
        scan_seeds=", ".join(map(str, plan.scan_seeds)), scan_steps=plan.scan_steps,
        scan_table=_markdown(table.sort_values(["lr", "arm", "seed"])), primary=PRIMARY,
        outcomes=", ".join(OUTCOMES), block=json.dumps(reg, indent=2, sort_keys=True),
    )


def _arms_table(plan: Plan) -> str:
    lines = ["| arm | model | algo | routing_replay | freeze_router |", "|---|---|---|---|---|"]
    for name in EVAL_ARMS:
        f = ARMS[name].fields(plan.model_keys)
        lines.append(f"| {name} | `{f['model']}` | {f['algo']} | {f['routing_replay']} | {f['freeze_router']} |")
    return "\n".join(lines)


def _markdown(table: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


_PREREG = """# Pre-registration: routing volatility, token-level GRPO and Routing Replay (issue 26)

Written by `scripts/controlled_experiment.py choose` on {date}, from the scan's run folders, before any evaluation
run. `scripts/controlled_experiment.py evaluate` refuses to start unless this file registers exactly what it would
run (the JSON block at the end). The method: docs/controlled.md.

**Question.** Does routing volatility destabilise token-level GRPO on an MoE, and does Routing Replay (R2: the old
policy's trainer routes; R3: the rollout engine's routes) fix it?

## The lr scan (reserved seeds {scan_seeds}; never evaluated)

Both controls without routing change (`dense_grpo_off`, `frozen_grpo_off`), {scan_steps} steps each. Stability
criterion, fixed in code before any run (`moestab.experiments.controlled.STABILITY_RULE`): {rule}.

{scan_table}

**Chosen lr: {lr}**, the largest lr at which both controls are stable on every reserved seed.

## The evaluation

Seeds {seeds} (fresh), {steps} steps, eval every {eval_every} steps, lr {lr}, the {layers}-layer embedded policy,
task arithmetic, bf16 rollouts against the fp32 trainer, routing's share of the ratio measured every update, no stop
on zero-advantage steps. Arms:

{arms}

**Primary outcome:** `{primary}`, the final eval accuracy (greedy, held-out problems). Further outcomes, per run:
{outcomes} (`routing_share`: the step mean of `routing_share/var_share`; the rest as in
`moestab.experiments.stability.run_stability`).

**Analysis.** For every arm and outcome, the paired differences arm - `{baseline}` over the seeds (same seed, same
warm-started base), their mean and the 95% t-interval `mean -+ t(0.975, n-1) * sd / sqrt(n)` (n = 5, t = 2.776).
Reading: if routing volatility destabilises token-level GRPO, `dense_grpo_off - {baseline}` and
`frozen_grpo_off - {baseline}` are positive on `{primary}`; if Routing Replay fixes it, so are `moe_grpo_r2 -
{baseline}` and `moe_grpo_r3 - {baseline}`. An interval that contains 0 is reported as no detected difference.
Whatever comes out is reported as is.

## The registered setting

```json registration
{block}
```
"""


def read_registration(path: str | Path) -> dict[str, Any]:
    """The registered setting of a pre-registration file; a clear error when it has none."""
    path = Path(path)
    if not path.is_file():
        raise PreregistrationError(f"no pre-registration at {path}: run `choose` and commit its file before "
                                   "`evaluate`")
    found = _BLOCK.search(path.read_text())
    if not found:
        raise PreregistrationError(f"{path} has no ```json registration block; regenerate it with `choose`")
    return json.loads(found.group(1))


class PreregistrationError(RuntimeError):
    """`evaluate` would run something other than what the pre-registration registers."""


def check_preregistration(plan: Plan, out: str | Path, path: str | Path) -> float:
    """The registered lr, after checking that the file registers exactly what `evaluate` would run: the lr the scan's
    folders choose and the plan's evaluation. Raises :class:`PreregistrationError` naming what differs."""
    registered = read_registration(path)
    expected = registration(plan, choose_lr(scan_table(plan, out)))
    differ = sorted(k for k in expected.keys() | registered.keys() if expected.get(k) != registered.get(k))
    if differ:
        raise PreregistrationError(f"{path} registers another setting than this evaluation would run; differing: "
                                   + "; ".join(f"{k}: registered {registered.get(k)!r}, would run {expected.get(k)!r}"
                                               for k in differ))
    return float(registered["lr"])


def run_evaluation(
    plan: Plan, out: str | Path, prereg: str | Path, *, log: Callable[[str], None] = logger.info,
    shards: tuple[int, int] = (0, 1),
) -> list[Path]:
    """Every evaluation run not finished yet, after :func:`check_preregistration`; ``shards`` ``(i, n)``: only
    shard ``i`` of ``n`` (:func:`moestab.experiments.grid.shard`), so that n processes share the evaluation."""
    lr = check_preregistration(plan, out, prereg)
    return run_grid(shard(evaluation_runs(plan, lr, out), *shards), log=log)


def run_outcomes(run: str | Path) -> dict[str, float | None]:
    """One run's :data:`OUTCOMES` (plus its start accuracy)."""
    m = run_stability(run)
    share = load_metrics(run).get(keys.ROUTING_SHARE_VAR)
    mean_share = float(share.mean()) if share is not None and share.notna().any() else None
    return {"start_acc": m["start_acc"], **{k: m[k] for k in OUTCOMES if k != "routing_share"},
            "routing_share": mean_share}


def outcomes_table(plan: Plan, out: str | Path, prereg: str | Path) -> pd.DataFrame:
    """One row per evaluation run: arm, seed and its outcomes."""
    runs = evaluation_runs(plan, float(read_registration(prereg)["lr"]), out)
    _require_finished(runs, "evaluation")
    return pd.DataFrame([{"arm": _arm_of(r), "seed": r.values["seed"], **run_outcomes(r.run_dir)} for r in runs])


def evaluation_metrics(plan: Plan, out: str | Path, prereg: str | Path) -> pd.DataFrame:
    """metrics.jsonl of every evaluation run, one row per step, with ``arm`` and ``seed`` columns."""
    runs = evaluation_runs(plan, float(read_registration(prereg)["lr"]), out)
    _require_finished(runs, "evaluation")
    return pd.concat([grid_metrics([r]).assign(arm=_arm_of(r)) for r in runs], ignore_index=True)


def paired_table(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Per arm (baseline excluded) and outcome: mean of arm - baseline over the shared seeds, sd and the 95% CI."""
    base = outcomes[outcomes["arm"] == BASELINE].set_index("seed")
    rows = []
    for arm in [a for a in EVAL_ARMS if a != BASELINE]:
        this = outcomes[outcomes["arm"] == arm].set_index("seed")
        for outcome in OUTCOMES:
            pairs = pd.concat([this[outcome], base[outcome]], axis=1, keys=["arm", "base"]).astype(float).dropna()
            if pairs.empty:
                rows.append({"arm": arm, "outcome": outcome, "n": 0})
                continue
            ci = paired_interval(pairs["arm"].tolist(), pairs["base"].tolist())
            rows.append({"arm": arm, "outcome": outcome, "n": ci.n, "mean_diff": ci.mean, "sd_diff": ci.sd,
                         "ci_low": ci.low, "ci_high": ci.high})
    return pd.DataFrame(rows)


def write_report(plan: Plan, out: str | Path, prereg: str | Path, dest: str | Path) -> list[Path]:
    """outcomes.csv, paired.csv and report.md in ``dest``; returns their paths."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    outcomes = outcomes_table(plan, out, prereg)
    paired = paired_table(outcomes)
    outcomes.to_csv(dest / "outcomes.csv", index=False)
    paired.to_csv(dest / "paired.csv", index=False)
    lr = read_registration(prereg)["lr"]
    (dest / "report.md").write_text(
        f"# Controlled experiment: outcomes (lr {lr}, pre-registered in {prereg})\n\n## Per seed\n\n"
        f"{_markdown(outcomes)}\n\n## Paired differences, arm - {BASELINE} (95% t-interval over seeds)\n\n"
        f"{_markdown(paired)}\n")
    return [dest / "outcomes.csv", dest / "paired.csv", dest / "report.md"]

"""Issue 41's precondition search: a setting of the embedded MoE where GSPO §5.3's precondition holds, found on
reserved seeds before any experiment is registered (docs/precondition.md; the launcher is
scripts/precondition_search.py).

GSPO §5.3 conditions its claim on about 10% of the experts activated for the same tokens changing after each update.
The manipulation check here asks for at least :data:`THRESHOLD` of them, measured as GSPO measures it: the share of
routed slots whose expert differs between the free pi_old and pi_new of a step (``routing/old_new/changed``), in
token-level GRPO without replay. A setting passes when that share, averaged over the steps of each reserved seed's run
and then over the seeds, reaches the threshold, *and* the routing-constant control (GRPO with every forward routed
as the frozen base, ``--routing-replay base``) is stable (the controlled experiment's :data:`STABILITY_RULE`) on
every reserved seed at the same lr: a setting where the control breaks too cannot tell routing's part apart.

The settings are tried in the registered order of :data:`SETTINGS` (cheapest first); the search stops at the first
that passes, or when the next setting would exceed the registered CPU budget. Every setting tried is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from moestab.experiments.controlled import STABILITY_RULE, is_stable
from moestab.experiments.grid import GridRun, grid_runs, is_finished, run_grid
from moestab.experiments.registration import check_registered
from moestab.experiments.stability import run_stability
from moestab.metrics import keys
from moestab.run_folder.reader import load_metrics

THRESHOLD = 0.05
"""The manipulation check: at least this share of routed slots changes old -> new per step (GSPO: ~10%)."""
SEEDS = (800, 801)
"""Reserved for the search: never evaluated, and disjoint from the controlled experiment's seeds (900-901 scan,
1000+ evaluation)."""
STEPS = 40
EVAL_EVERY = 10
BUDGET_CORE_HOURS = 3.0
"""The search's CPU budget (one torch thread per run, so core-hours are run-hours), estimated before each setting."""
ARMS = {"moe_grpo_off": "off", "constant_grpo": "base"}
"""The two runs of a setting per seed: the MoE whose volatility is measured, and the routing-constant control."""


@dataclass(frozen=True)
class Setting:
    """One candidate: the embedded policy's shape, its warm start's load-balancing coefficient, the task, the lr."""

    name: str
    model: str
    lr: float
    aux: float = 0.01
    task: str = "arithmetic"
    step_seconds: float = 2.0
    """The estimated wall time of one step of one run (one thread), for the budget (measured by the calibration
    runs of docs/precondition.md, before the search)."""

    def fields(self) -> dict[str, Any]:
        return {"model": self.model, "lr": self.lr, "warm_start_aux_loss_coef": self.aux, "task": self.task}

    def core_hours(self, seeds: int = len(SEEDS), steps: int = STEPS) -> float:
        return len(ARMS) * seeds * steps * self.step_seconds / 3600


_L8, _FINE8 = "embedded:layers=8", "embedded:fine,layers=8"
SETTINGS: tuple[Setting, ...] = (
    # The controlled experiment's 8-layer policy on the load-balanced base (issue 41.1), lr rising: volatility grows
    # with the lr (docs/stress.md), and so does the risk that the control breaks.
    Setting("L8-lr2e-4", _L8, 2e-4, step_seconds=1.5),
    Setting("L8-lr5e-4", _L8, 5e-4, step_seconds=1.5),
    Setting("L8-lr1e-3", _L8, 1e-3, step_seconds=1.5),
    # Fine-grained experts (64, top-8, Qwen3-30B-A3B's style): more experts near each token's k-th choice.
    Setting("fine8-lr2e-4", _FINE8, 2e-4, step_seconds=3.0),
    Setting("fine8-lr5e-4", _FINE8, 5e-4, step_seconds=3.0),
    # A stronger load-balancing loss in the warm start: flatter routers, smaller top-k margins.
    Setting("L8-aux0.05-lr2e-4", _L8, 2e-4, aux=0.05, step_seconds=1.5),
    Setting("L8-aux0.05-lr5e-4", _L8, 5e-4, aux=0.05, step_seconds=1.5),
    # Long responses (33 tokens, configs/long.yaml's task) on the 4-layer default: more tokens per sequence.
    Setting("sort32-L4-lr2e-4", "embedded", 2e-4, task="sort:length=32", step_seconds=10.0),
)
"""The registered order (docs/precondition.md). Each estimate covers a step of either arm with its share of the
evaluations and of the warm start, from the calibration runs of docs/precondition.md."""


def base_fields(threads: int = 1, cache_dir: str | None = None) -> dict[str, Any]:
    """TrainConfig fields every run of the search shares: the controlled experiment's (bf16 rollouts, routing's share
    measured, no stop on zero-advantage steps, every step measured), GRPO."""
    return {"algo": "grpo", "rollout_dtype": "bfloat16", "routing_share": True, "max_zero_advantage_steps": 0,
            "threads": threads, "cache_dir": cache_dir, "steps": STEPS, "eval_every": EVAL_EVERY}


def setting_runs(setting: Setting, out: str | Path, *, seeds: Sequence[int] = SEEDS,
                 extra: dict[str, Any] | None = None) -> list[GridRun]:
    """The setting's runs, in ``out/<setting>/<arm>/seed-<seed>``."""
    runs = []
    for arm, replay in ARMS.items():
        fields = {**(extra or {}), **setting.fields(), "routing_replay": replay}
        runs += grid_runs(fields, {}, seeds, Path(out) / setting.name / arm)
    return runs


def setting_row(setting: Setting, runs: Sequence[GridRun], threshold: float = THRESHOLD) -> dict[str, Any]:
    """What the search records of a finished setting: volatility per seed and its mean, the volatility per layer,
    the control's stability per seed, whether the setting passes, and the measured cost."""
    moe = [r for r in runs if r.run_dir.parent.name == "moe_grpo_off"]
    control = [r for r in runs if r.run_dir.parent.name == "constant_grpo"]
    metrics = {r.run_dir: load_metrics(r.run_dir) for r in runs}
    vols = [run_stability(r.run_dir)["vol"] for r in moe]
    by_layer = [metrics[r.run_dir][keys.ROUTING_CHANGED_BY_LAYER.format(pair="old_new")].dropna().tolist()
                for r in moe]
    layers = pd.DataFrame([row for run in by_layer for row in run]).mean().round(4).tolist()  # step x seed mean
    stable = [is_stable(run_stability(r.run_dir)) for r in control]
    seconds = sum(float(m[keys.TIME_STEP].sum()) for m in metrics.values())
    vol = sum(vols) / len(vols)
    return {"setting": setting.name, **setting.fields(), "vol": vol, "vol_by_seed": vols, "vol_by_layer": layers,
            "control_stable": stable, "passes": vol >= threshold and all(stable),
            "core_hours": seconds / 3600, "estimated_core_hours": setting.core_hours(len(moe))}


def search(settings: Sequence[Setting], out: str | Path, *, seeds: Sequence[int] = SEEDS,
           extra: dict[str, Any] | None = None, budget: float = BUDGET_CORE_HOURS, threshold: float = THRESHOLD,
           log: Callable[[str], None] = print, dry: bool = False) -> list[dict[str, Any]]:
    """Run the settings in order (finished runs reused) until one passes or the budget would be exceeded; the rows
    of every setting tried. ``dry``: run nothing, report the finished settings only (the table of a search in
    progress)."""
    rows, spent = [], 0.0
    for setting in settings:
        runs = setting_runs(setting, out, seeds=seeds, extra=extra)
        if not all(is_finished(r) for r in runs):
            if dry:
                break
            if spent + setting.core_hours(len(seeds)) > budget:
                log(f"{setting.name}: not tried, its estimated {setting.core_hours(len(seeds)):.2f} core-hours would "
                    f"exceed the budget ({spent:.2f} of {budget} spent)")
                break
            run_grid(runs, log=log)
        row = setting_row(setting, runs, threshold)
        rows.append(row)
        spent += row["core_hours"]
        log(f"{setting.name}: vol {row['vol']:.2%}, control stable {row['control_stable']}, "
            f"{'passes' if row['passes'] else 'fails'} ({row['core_hours']:.2f} core-hours)")
        if row["passes"]:
            break
    return rows


def registration(settings: Sequence[Setting], seeds: Sequence[int] = SEEDS) -> dict[str, Any]:
    """Everything the search fixes before it runs."""
    return {"threshold": THRESHOLD, "measure": keys.ROUTING_CHANGED.format(pair="old_new"), "seeds": list(seeds),
            "steps": STEPS, "eval_every": EVAL_EVERY, "arms": ARMS, "base": base_fields(),
            "stability_rule": STABILITY_RULE, "budget_core_hours": BUDGET_CORE_HOURS,
            "settings": [asdict(s) for s in settings]}


def check_registration(path: str | Path, settings: Sequence[Setting], seeds: Sequence[int] = SEEDS) -> None:
    """Refuse to run unless ``path`` (docs/precondition.md) registers exactly :func:`registration`."""
    check_registered(path, registration(settings, seeds))

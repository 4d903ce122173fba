"""Issue 52: which routing change breaks GRPO here, within a step or across steps? The powered experiment's result
taken apart (docs/drift.md; launcher scripts/drift_experiment.py).

The powered experiment (:mod:`moestab.experiments.powered`) found routing held at the base's prevents the collapse
of MoE GRPO at lr 5e-4 while Routing Replay (R2 / R3), which removes only the change within a step, does not
detectably help. Three stages, on the powered experiment's setting, bases and seeds, all registered before their
runs:

1. **analysis** of rebuilt runs (the powered experiment's folders are gone): the final checkpoints evaluated under the
   other routing (routing-constant with free routes, the baseline and R3 under the base's), per step the expert-load
   entropy and the distance of the rollout's routes from the base's, the change after one update;
2. **within-step vs across-step drift**, a dose-response: routing held at a copy of the policy refreshed every K
   steps (K = 1: pi_old's routes in every forward of a step; 10; 33; K = infinity: routing-constant), and the
   baseline with a load-balancing loss during RL;
3. **GSPO, routing or step size**: GSPO with routing held at the base's, dense GSPO (a 2 x 2 with the GRPO arms),
   and GRPO at the lr whose routing change is GSPO's.

The primary outcome is the mean eval accuracy over a run's evaluations (steps ``eval_every`` .. ``steps``), with
collapse (final accuracy more than 10 points below the start) co-primary; each stage's primary contrasts are
Holm-corrected together, per outcome.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moestab.experiments.grid import GridRun, grid_runs, run_grid, shard
from moestab.experiments.powered import Design, holm, manifest, paired_p
from moestab.experiments.registration import check_registered
from moestab.metrics import keys
from moestab.metrics.collapse_warning import COLLAPSE_DROP
from moestab.metrics.paired import min_detectable_difference, paired_interval
from moestab.run_folder import schema
from moestab.run_folder.reader import load_metrics, read_run_info

BASELINE = "moe_grpo_off"
ARMS: dict[str, tuple[int, dict[str, Any]]] = {
    # stage 1: the powered experiment's arms the analysis needs, rebuilt
    "moe_grpo_off": (1, {"algo": "grpo", "routing_replay": "off"}),
    "moe_grpo_r3": (1, {"algo": "grpo", "routing_replay": "rollout"}),
    "constant_grpo": (1, {"algo": "grpo", "routing_replay": "base"}),
    # stage 2: routing held within windows of K steps, and the baseline balanced during RL
    "refresh_k1": (2, {"algo": "grpo", "routing_replay": "base", "base_refresh_every": 1}),
    "refresh_k10": (2, {"algo": "grpo", "routing_replay": "base", "base_refresh_every": 10}),
    "refresh_k33": (2, {"algo": "grpo", "routing_replay": "base", "base_refresh_every": 33}),
    "moe_grpo_lb": (2, {"algo": "grpo", "routing_replay": "off", "router_aux_loss_coef": 0.01}),
    # stage 3: GSPO's stability, routing or step size
    "moe_gspo_off": (3, {"algo": "gspo", "routing_replay": "off"}),
    "constant_gspo": (3, {"algo": "gspo", "routing_replay": "base"}),
    "dense_grpo_off": (3, {"algo": "grpo", "routing_replay": "off", "dense": True}),
    "dense_gspo_off": (3, {"algo": "gspo", "routing_replay": "off", "dense": True}),
    "moe_grpo_lrmatch": (3, {"algo": "grpo", "routing_replay": "off", "lr_match": True}),
}
"""Arm -> (stage, its TrainConfig fields); ``dense``: the dense policy of the same depth; ``lr_match``: at
:attr:`DriftDesign.lr_match` instead of the design's lr."""
DOSE = (("refresh_k1", 0), ("refresh_k10", 1), ("refresh_k33", 2), ("constant_grpo", 3))
"""The dose-response's levels in order of the window routing is held for (1, 10, 33 steps, the whole run), coded
0..3 for the trend."""
TREND = "trend"
"""The dose-response's contrast: per seed, the least-squares slope of the outcome over :data:`DOSE`'s codes."""
CONTRASTS: dict[int, dict[str, tuple[tuple[str, str] | str, ...]]] = {
    2: {"primary": (("refresh_k10", BASELINE), ("refresh_k33", BASELINE), ("moe_grpo_lb", BASELINE), TREND),
        "secondary": (("refresh_k1", BASELINE), ("constant_grpo", "refresh_k1"), ("constant_grpo", BASELINE),
                      ("moe_grpo_r3", BASELINE))},
    3: {"primary": (("constant_gspo", "constant_grpo"), ("dense_gspo_off", "dense_grpo_off"),
                    ("moe_grpo_lrmatch", BASELINE)),
        "secondary": (("moe_gspo_off", BASELINE), ("dense_grpo_off", BASELINE))},
}
"""Per stage: ``(arm, reference)`` paired by seed, or :data:`TREND`. Primary ones are Holm-corrected together per
outcome; secondary ones are reported unadjusted."""
READINGS = {
    2: "Routing held within a step (K = 1) is what R2 / R3 do; held across more steps it also stops drift. If the "
       "outcome rises with the window (trend > 0) and K = 10 / 33 beat the baseline, the collapse comes from drift "
       "across steps (or from lost adaptability acting as a constraint), not from the change within a step. A trend "
       "whose interval contains 0, with K = 1 as good as routing-constant, says holding routes within a step "
       "suffices. The load-balancing arm above the baseline says drift away from balanced routes contributes.",
    3: "GSPO above GRPO with routing held at the base's (constant) and on the dense model says its stability does not "
       "come from routing; GRPO at GSPO's routing change as stable as GSPO says routing change alone could explain "
       "it, and no better than the baseline says it does not.",
}
OUTCOMES = ("mean_eval_acc", "collapse")
"""Primary: mean eval accuracy over the run's evaluations; co-primary: collapse."""

# ---- amendment 1 (docs/drift.md), fixed before any stage 2 or 3 contrast was computed; not registered before the
# runs, so reported beside the registered results and labelled as such --------------------------------------------
FREE_OUTCOMES = ("free_eval_acc", "free_collapse")
"""The outcomes again with every evaluation routing freely: the mean eval accuracy of the checkpoints at the
``save_every`` steps after 0 (20, 40, ..., 100) and collapse by the last one. A run routed by a frozen model
(routing-constant, the refresh arms) records its evaluations under that model's routes, up to K steps stale, which
favours it by more the longer routing is held; these outcomes are free of that."""
TREND_FINITE = "trend_finite"
"""The dose-response without K = infinity: the slope over K = 1, 10, 33 alone (codes 0..2), so that routing-constant
cannot make the trend by itself."""
INTERACTIONS = {
    "interaction_held": (("constant_gspo", "constant_grpo"), ("moe_gspo_off", BASELINE)),
    "interaction_dense": (("dense_gspo_off", "dense_grpo_off"), ("moe_gspo_off", BASELINE)),
}
"""Stage 3's 2 x 2 interactions, per seed ``(a - b) - (c - d)``: how much GSPO's advantage over GRPO changes when
routing is held at the base's, or on the dense model, against the free MoE."""
AMENDED: dict[int, tuple[tuple[str, str] | str, ...]] = {
    2: (TREND_FINITE,),
    3: (("moe_grpo_lrmatch", "moe_gspo_off"), *INTERACTIONS),
}
"""Per stage, the contrasts amendment 1 adds, reported unadjusted."""
EQUIVALENCE = "the 95% interval of the difference lies within +- the stage's registered minimum detectable difference"
"""Amendment 1's rule for "as good as": an interval containing 0 alone is absence of evidence."""
ASSUMED_SD = 0.046
"""The paired sd of the mean eval accuracy the power computation assumes: the upper end of the powered experiment's
2.4-4.6 points (post hoc, :func:`posthoc_sd` on its committed curves)."""
MATCH_WINDOW = 40
"""Steps over which the lr match compares routing change (the precondition search's window)."""


@dataclass(frozen=True)
class DriftDesign:
    """The powered experiment's design (its setting, seeds, length and eval set) and this experiment's additions."""

    powered: Design
    lr_match: float
    """GRPO's lr whose old->new routing change is GSPO's at the design's lr (:func:`matching_lr`)."""
    stages: tuple[int, ...] = (1, 2, 3)
    alpha: float = 0.05
    power: float = 0.8
    assumed_sd: float = ASSUMED_SD

    def base(self) -> dict[str, Any]:
        """TrainConfig fields every run shares: the powered experiment's, and the distance from the base measured."""
        return {**self.powered.base(), "measure_base_routes": True}

    def arms(self) -> list[str]:
        return [arm for arm, (stage, _) in ARMS.items() if stage in self.stages]

    def arm_fields(self, arm: str) -> dict[str, Any]:
        _, fields = ARMS[arm]
        out = {k: v for k, v in fields.items() if k not in ("dense", "lr_match")}
        out["model"] = self.powered.dense_model() if fields.get("dense") else self.powered.model
        out["lr"] = self.lr_match if fields.get("lr_match") else self.powered.lr
        return out

    def min_detectable(self, stage: int) -> float:
        """The smallest true paired difference in mean eval accuracy each of ``stage``'s primary contrasts detects
        with :attr:`power` at Bonferroni's alpha / m (Holm is never stricter)."""
        m = len(CONTRASTS[stage]["primary"])
        return min_detectable_difference(self.assumed_sd, len(self.powered.seeds), self.alpha / m, self.power)


def all_runs(design: DriftDesign, out: str | Path) -> list[GridRun]:
    """``out/<arm>/seed-<s>``, stage by stage, seed by seed: a stage's complete pairs come first."""
    runs = []
    for stage in design.stages:
        for seed in design.powered.seeds:
            for arm in design.arms():
                if ARMS[arm][0] == stage:
                    runs += grid_runs({**design.base(), **design.arm_fields(arm)}, {}, [seed], Path(out) / arm)
    return runs


def registration(design: DriftDesign) -> dict[str, Any]:
    """Everything the experiment fixes before it runs."""
    powered = {k: v for k, v in design.powered.base().items() if k != "cache_dir"}
    return {"setting": {"model": design.powered.model, "lr": design.powered.lr, "task": design.powered.task,
                        "seeds": list(design.powered.seeds), "steps": design.powered.steps,
                        "eval_every": design.powered.eval_every, "eval_size": design.powered.eval_size},
            "base": {**powered, "measure_base_routes": True},
            "arms": {arm: {"stage": ARMS[arm][0], **design.arm_fields(arm)} for arm in design.arms()},
            "lr_match": design.lr_match, "dose": dict(DOSE), "baseline": BASELINE,
            "outcomes": {"primary": OUTCOMES[0], "co_primary": OUTCOMES[1],
                         "collapse": f"final eval accuracy more than {COLLAPSE_DROP:.0%} below the start"},
            "contrasts": {str(s): {k: [list(c) if isinstance(c, tuple) else c for c in v]
                                   for k, v in CONTRASTS[s].items()} for s in CONTRASTS if s in design.stages},
            "readings": {str(s): READINGS[s] for s in READINGS if s in design.stages},
            "multiplicity": "Holm step-down over each stage's primary contrasts, per outcome, at family-wise alpha",
            "alpha": design.alpha, "power": design.power, "assumed_sd": design.assumed_sd,
            "min_detectable_difference": {str(s): round(design.min_detectable(s), 4) for s in CONTRASTS
                                          if s in design.stages},
            "runs": len(all_runs(design, "out"))}


def run_experiment(design: DriftDesign, out: str | Path, registered: str | Path, *, shards: tuple[int, int] = (0, 1),
                   log: Callable[[str], None] = print) -> list[Path]:
    """Every run not finished yet, stage by stage, after checking the registration."""
    check_registered(registered, registration(design))
    return run_grid(shard(all_runs(design, out), *shards), log=log)


# ---- what the design is built from -------------------------------------------------------------------------------
def matching_lr(curves: pd.DataFrame, *, target_arm: str = "moe_gspo_off", arm: str = BASELINE, lr: float = 5e-4,
                lower: float = 2.5e-4, window: int = MATCH_WINDOW) -> float:
    """The lr at which ``arm``'s mean old->new routing change over the first ``window`` steps equals
    ``target_arm``'s at ``lr``: interpolated linearly in log lr between ``arm``'s runs at ``lower`` and ``lr`` (the
    powered experiment's committed curves), rounded to two significant digits."""
    early = curves[curves["step"] <= window]
    vol = early.groupby(["arm", "lr"])["vol"].mean()
    target, low, high = vol[(target_arm, lr)], vol[(arm, lower)], vol[(arm, lr)]
    x = (target - low) / (high - low)  # position between the two lrs, in log2 units of their ratio
    matched = lower * (lr / lower) ** x
    return float(f"{matched:.2g}")


def posthoc_sd(curves: pd.DataFrame, lr: float, baseline: str = BASELINE) -> pd.Series:
    """Per arm, the sd of the paired differences arm - ``baseline`` in mean eval accuracy over the evaluations after
    step 0, at ``lr`` (the powered experiment's committed curves)."""
    mean = curves[(curves["lr"] == lr) & (curves["step"] > 0)].groupby(["seed", "arm"])["eval_acc"].mean().unstack()
    return mean.sub(mean[baseline], axis=0).drop(columns=baseline).std()


# ---- outcomes and contrasts --------------------------------------------------------------------------------------
def run_outcomes(run: str | Path) -> dict[str, float]:
    """A run's ``start_acc``, ``final_acc``, ``mean_eval_acc`` (over its evaluations after step 0) and ``collapse``
    (1.0 when the final accuracy is more than ``COLLAPSE_DROP`` below the start)."""
    info = read_run_info(run)
    m = load_metrics(run)
    evals = m[keys.EVAL_ACCURACY].dropna()
    start, final = info.warm_start_accuracy, info.final_accuracy
    return {"start_acc": start, "final_acc": final, "mean_eval_acc": float(evals.mean()),
            "collapse": float(start is not None and final is not None and final < start - COLLAPSE_DROP)}


def outcomes(runs: Sequence[GridRun]) -> pd.DataFrame:
    """One row per finished run: arm, seed, lr and :func:`run_outcomes`."""
    return pd.DataFrame([{"arm": r.run_dir.parent.name, "seed": r.values["seed"], "lr": r.config.lr,
                          **run_outcomes(r.run_dir)} for r in runs])


def mcnemar_p(arm: Sequence[float], reference: Sequence[float]) -> float:
    """Exact two-sided McNemar p-value of paired binary outcomes: the discordant pairs' split against 1/2."""
    b = sum(1 for x, y in zip(arm, reference, strict=True) if x and not y)
    c = sum(1 for x, y in zip(arm, reference, strict=True) if y and not x)
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def trend_slopes(table: pd.DataFrame, outcome: str, levels: Sequence[tuple[str, int]] = DOSE) -> pd.Series:
    """Per seed with every level of ``levels`` (:data:`DOSE`), the least-squares slope of ``outcome`` over the levels'
    codes."""
    wide = table.pivot(index="seed", columns="arm", values=outcome)
    arms, codes = [a for a, _ in levels], np.array([c for _, c in levels], float)
    wide = wide.reindex(columns=arms).dropna()
    centred = codes - codes.mean()
    return (wide.to_numpy() - wide.to_numpy().mean(axis=1, keepdims=True)) @ centred / (centred @ centred) \
        if len(wide) else pd.Series(dtype=float)


def _pairs(table: pd.DataFrame, contrast: tuple[str, str] | str, outcome: str) -> tuple[list[float], list[float]]:
    """The contrast's paired values (arm, reference) over the seeds that have both; a trend's slopes, and an
    interaction's per-seed ``(a - b) - (c - d)``, against 0."""
    if contrast in (TREND, TREND_FINITE):
        levels = DOSE if contrast == TREND else [(arm, code) for arm, code in DOSE if arm != "constant_grpo"]
        slopes = list(np.asarray(trend_slopes(table, outcome, levels), float))
        return slopes, [0.0] * len(slopes)
    if contrast in INTERACTIONS:
        (a, b), (c, d) = INTERACTIONS[contrast]
        wide = table.pivot(index="seed", columns="arm", values=outcome).reindex(columns=[a, b, c, d]).dropna()
        values = ((wide[a] - wide[b]) - (wide[c] - wide[d])).tolist()
        return values, [0.0] * len(values)
    arm, ref = contrast
    wide = table.pivot(index="seed", columns="arm", values=outcome).reindex(columns=[arm, ref]).dropna()
    return wide[arm].tolist(), wide[ref].tolist()


def contrast_name(contrast: tuple[str, str] | str) -> str:
    """``"arm - reference"``, or the trend's or interaction's name."""
    return contrast if isinstance(contrast, str) else f"{contrast[0]} - {contrast[1]}"


def contrasts(table: pd.DataFrame, design: DriftDesign, stage: int) -> pd.DataFrame:
    """``stage``'s contrasts on each outcome ``table`` has: mean paired difference, 95% t-interval, p (paired t for
    an accuracy, exact McNemar for a collapse; trends and interactions: the t-test of their per-seed values), Holm's
    adjusted p over the primary ones per outcome (an undefined p, all differences 0, counts as 1: the family keeps
    its registered size), the realized sd and the minimum detectable difference it gives at the level the contrast
    was powered at (accuracy rows only: a t-test's, in the contrast's own units, a trend's per level). ``kind``:
    ``primary`` / ``secondary`` (registered), ``amended`` (amendment 1: :data:`AMENDED`); ``registered_outcome``:
    False for :data:`FREE_OUTCOMES` (amendment 1)."""
    rows = []
    primary = CONTRASTS[stage]["primary"]
    listed = [(kind, c) for kind in ("primary", "secondary") for c in CONTRASTS[stage][kind]]
    listed += [("amended", c) for c in AMENDED.get(stage, ())]
    for kind, contrast in listed:
        for outcome in [o for o in (*OUTCOMES, *FREE_OUTCOMES) if o in table.columns]:
            binary = outcome in (OUTCOMES[1], FREE_OUTCOMES[1])
            a, b = _pairs(table, contrast, outcome)
            ci = paired_interval(a, b) if len(a) >= 2 else None
            diffs = [x - y for x, y in zip(a, b, strict=True)]
            p = mcnemar_p(a, b) if binary and isinstance(contrast, tuple) else paired_p(diffs)
            level = design.alpha / len(primary) if kind == "primary" else design.alpha
            detectable = (min_detectable_difference(ci.sd, ci.n, level, design.power)
                          if ci is not None and ci.sd > 0 and not binary else math.nan)
            rows.append({"stage": stage, "contrast": contrast_name(contrast), "outcome": outcome,
                         "primary": kind == "primary", "kind": kind,
                         "registered_outcome": outcome in OUTCOMES, "n": len(a),
                         "mean_diff": ci.mean if ci else math.nan, "ci_low": ci.low if ci else math.nan,
                         "ci_high": ci.high if ci else math.nan, "p": p, "sd": ci.sd if ci else math.nan,
                         "min_detectable": detectable})
    out = pd.DataFrame(rows)
    out["p_holm"] = math.nan
    for outcome in out["outcome"].unique():
        chosen = out["primary"] & (out["outcome"] == outcome)
        out.loc[chosen, "p_holm"] = holm(out.loc[chosen, "p"].fillna(1.0).tolist())
    return out


def equivalent(row: pd.Series | dict, design: DriftDesign, stage: int) -> bool:
    """Amendment 1's "as good as" (:data:`EQUIVALENCE`) for a contrast row of mean eval accuracy."""
    margin = design.min_detectable(stage)
    return bool(-margin < row["ci_low"] and row["ci_high"] < margin)


def lr_match_check(curves: pd.DataFrame, window: int = MATCH_WINDOW) -> dict[str, float]:
    """Amendment 1's check that the lr match held in this draw: per seed, the mean old->new routing change over the
    first ``window`` steps of the lr-matched GRPO arm against GSPO's (``step_curves.csv``), paired."""
    if not {"step", "arm", "old_new"} <= set(curves.columns):  # no finished run yet: a header-only table
        return {"n": 0.0}
    early = curves[(curves["step"] <= window) & curves["arm"].isin(["moe_grpo_lrmatch", "moe_gspo_off"])]
    wide = early.groupby(["seed", "arm"])["old_new"].mean().unstack().dropna()
    if len(wide) < 2:
        return {"n": float(len(wide))}
    ci = paired_interval(wide["moe_grpo_lrmatch"].tolist(), wide["moe_gspo_off"].tolist())
    return {"n": float(ci.n), "lrmatch": float(wide["moe_grpo_lrmatch"].mean()),
            "gspo": float(wide["moe_gspo_off"].mean()), "mean_diff": ci.mean, "ci_low": ci.low, "ci_high": ci.high}


# ---- stage 1: the analysis ----------------------------------------------------------------------------------------
ANALYSED_ARMS = ("moe_grpo_off", "moe_grpo_r3", "constant_grpo")
"""Arms whose final checkpoints are evaluated under both routings."""
ROUTINGS = ("free", "base")


def checkpoint_accuracy(run: str | Path, routing: str, step: int | None = None) -> float:
    """Greedy eval accuracy of ``run``'s checkpoint of ``step`` (default: its last) on the run's own eval set, routing
    freely (``free``) or with every forward routed as the run's warm-started base routes the same tokens (``base``;
    the warm-started base, never a refresh arm's copy)."""
    import torch
    from transformers import AutoTokenizer

    from moestab.routing.base_routing import BaseRouting
    from moestab.run_folder import RunFolder
    from moestab.tasks import task_from_spec
    from moestab.train.config import TrainConfig
    from moestab.train.evaluate import greedy_accuracy
    from moestab.train.recipe import DTYPES, load_policy, response_budget

    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r}: valid {ROUTINGS}")
    info = read_run_info(run)
    config = TrainConfig(**{k: v for k, v in info.config.items() if k in TrainConfig.__dataclass_fields__})
    task = task_from_spec(config.task)
    dtype, cpu = DTYPES[config.dtype], torch.device("cpu")
    path = str(RunFolder(run).checkpoint_dir(info.last_step if step is None else step))
    model = load_policy(path, dtype, cpu).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    eval_set = task.eval_set(config.eval_size, seed=config.seed + 1)
    budget = response_budget(config, task)
    if routing == "free":
        return greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=budget)
    base = load_policy(str((info.warm_start or {})["path"]), dtype, cpu).eval().requires_grad_(False)
    with BaseRouting(model, base):
        return greedy_accuracy(model, tokenizer, task, eval_set, max_new_tokens=budget)


def _known(known: pd.DataFrame | None, key: dict[str, Any]) -> pd.Series | None:
    """The row of ``known`` (an earlier report's table) with every ``key`` value, if exactly one: evaluations of a
    finished run's checkpoints never change, so a report computes each once (``created`` names the run)."""
    if known is None or known.empty or not set(key) <= set(known.columns):
        return None
    match = known
    for column, value in key.items():
        match = match[match[column].astype(str) == str(value)]
    return match.iloc[0] if len(match) == 1 else None


def checkpoint_evals(runs: Sequence[GridRun], known: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per finished run of :data:`ANALYSED_ARMS`: its final checkpoint's accuracy under each routing, beside the
    accuracy the run recorded at its end (under its own routing: the base's for routing-constant); rows of ``known``
    for the same run reused."""
    rows = []
    for run in runs:
        arm = run.run_dir.parent.name
        if arm not in ANALYSED_ARMS or not _finished(run):
            continue
        info = read_run_info(run.run_dir)
        key = {"arm": arm, "seed": run.values["seed"], "created": info.created}
        earlier = _known(known, key)
        evaluated = ({routing: float(earlier[routing]) for routing in ROUTINGS} if earlier is not None
                     else {routing: checkpoint_accuracy(run.run_dir, routing) for routing in ROUTINGS})
        rows.append({**key, "recorded": info.final_accuracy, **evaluated})
    return pd.DataFrame(rows)


def free_eval_steps(config: Any) -> list[int]:
    """The steps whose checkpoint :data:`FREE_OUTCOMES` evaluate: the ``save_every`` steps after 0 and the last, where
    the run also evaluated (20, 40, ..., 100 here)."""
    saved = {s for s in range(config.save_every, config.steps + 1, config.save_every)} | {config.steps}
    return sorted(s for s in saved if s % config.eval_every == 0 or s == config.steps)


def free_evals(runs: Sequence[GridRun], known: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per finished run and :func:`free_eval_steps` step: the accuracy it recorded and its accuracy routing freely:
    the recorded one where the run evaluated with free routes, else its checkpoint evaluated so
    (``source``: ``recorded`` / ``evaluated``); evaluated rows of ``known`` for the same run reused."""
    rows = []
    for run in runs:
        if not _finished(run):
            continue
        info = read_run_info(run.run_dir)
        metrics = load_metrics(run.run_dir).set_index(keys.STEP)[keys.EVAL_ACCURACY]
        held = run.config.routing_replay in schema.BASE_ROUTED_MODES
        for step in free_eval_steps(run.config):
            key = {"arm": run.run_dir.parent.name, "seed": run.values["seed"], "step": step, "created": info.created}
            recorded = float(metrics.get(step, math.nan))
            earlier = _known(known, key) if held else None
            free = (recorded if not held else float(earlier["free"]) if earlier is not None
                    else checkpoint_accuracy(run.run_dir, "free", step))
            rows.append({**key, "recorded": recorded, "free": free, "source": "evaluated" if held else "recorded"})
    return pd.DataFrame(rows)


def with_free_outcomes(table: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """``table`` (:func:`outcomes`) with :data:`FREE_OUTCOMES` from :func:`free_evals`' rows."""
    if evals.empty:
        return table.assign(**{name: math.nan for name in FREE_OUTCOMES})
    last = evals.sort_values("step").groupby(["arm", "seed"]).tail(1).set_index(["arm", "seed"])["free"]
    mean = evals.groupby(["arm", "seed"])["free"].mean()
    out = table.set_index(["arm", "seed"])
    out[FREE_OUTCOMES[0]] = mean.reindex(out.index)
    final = last.reindex(out.index)
    out[FREE_OUTCOMES[1]] = (final < out["start_acc"] - COLLAPSE_DROP).astype(float).where(final.notna())
    return out.reset_index()


STEP_COLUMNS = {
    "reward": keys.REWARD_MEAN,
    "eval_acc": keys.EVAL_ACCURACY,
    "old_new": keys.ROUTING_CHANGED.format(pair="old_new"),
    "base_distance": keys.ROUTING_BASE_CHANGED,
    "clip_frac": keys.CLIP_TOKEN_FRAC,
}
"""step_curves.csv's columns -> the metrics.jsonl keys they copy."""


def step_curves(runs: Sequence[GridRun]) -> pd.DataFrame:
    """Per finished run and step: :data:`STEP_COLUMNS`, the expert-load entropy (mean over the MoE layers, nats) and
    the routing change after one update (``update_old`` at the second minibatch: the free routes after the first
    minibatch's update vs pi_old's; null where the updates replay routes)."""
    frames = []
    for run in runs:
        if not _finished(run):
            continue
        m = load_metrics(run.run_dir)
        frame = pd.DataFrame({"arm": run.run_dir.parent.name, "seed": run.values["seed"], "step": m[keys.STEP]})
        for column, key in STEP_COLUMNS.items():
            frame[column] = m.get(key, math.nan)
        frame["load_entropy"] = [_mean(v) for v in m.get(keys.EXPERTS_LOAD_ENTROPY, [None] * len(m))]
        frame["single_update"] = [_second(v) for v in m.get(keys.ROUTING_UPDATE_DRIFT, [None] * len(m))]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _mean(values: Any) -> float:
    return float(np.mean(values)) if isinstance(values, list) and values else math.nan


def _second(values: Any) -> float:
    return float(values[1]) if isinstance(values, list) and len(values) > 1 and values[1] is not None else math.nan


def _finished(run: GridRun) -> bool:
    return run.run_dir.joinpath("run.json").is_file() and read_run_info(run.run_dir).status == "finished"


def replication(table: pd.DataFrame, committed: pd.DataFrame, lr: float) -> pd.DataFrame:
    """The rebuilt runs of the powered experiment's arms beside its committed outcomes (same arm, seed, lr): start and
    final accuracy, both, and whether they are equal."""
    theirs = committed[committed["lr"] == lr][["arm", "seed", "start_acc", "final_acc"]]
    mine = table[["arm", "seed", "start_acc", "final_acc"]]
    both = mine.merge(theirs, on=["arm", "seed"], suffixes=("", "_committed"))
    both["same_start"] = both["start_acc"] == both["start_acc_committed"]
    both["same_final"] = both["final_acc"] == both["final_acc_committed"]
    return both


RESULT_FILES = ("outcomes.csv", "contrasts.csv", "checkpoint_evals.csv", "free_evals.csv", "step_curves.csv",
                "replication.csv", "manifest.csv")


def write_results(design: DriftDesign, out: str | Path, dest: str | Path,
                  committed_outcomes: str | Path | None = None) -> list[Path]:
    """:data:`RESULT_FILES` in ``dest`` from the runs under ``out`` of every complete stage (all its arms finished on
    every seed, and every earlier stage's): nothing of a stage is read before it completes, so no interim look
    steers it; the replication only with ``committed_outcomes`` (the powered experiment's)."""
    runs = all_runs(design, out)
    dest = Path(dest)
    complete = [s for s in design.stages if all(_finished(r) for r in runs if ARMS[r.run_dir.parent.name][0] <= s)]
    finished = [r for r in runs if ARMS[r.run_dir.parent.name][0] in complete]
    evals = free_evals(finished, _earlier(dest / "free_evals.csv"))
    table = (with_free_outcomes(outcomes(finished), evals) if finished
             else pd.DataFrame(columns=["arm", "seed", "lr", *OUTCOMES, *FREE_OUTCOMES]))
    complete = [s for s in complete if s in CONTRASTS]
    frames = {
        "outcomes.csv": table,
        "contrasts.csv": pd.concat([contrasts(table, design, s) for s in complete]) if complete else pd.DataFrame(),
        "checkpoint_evals.csv": checkpoint_evals(finished, _earlier(dest / "checkpoint_evals.csv")),
        "free_evals.csv": evals,
        "step_curves.csv": step_curves(finished),
        "replication.csv": (replication(table, pd.read_csv(committed_outcomes), design.powered.lr)
                            if committed_outcomes is not None and len(table) else pd.DataFrame()),
        "manifest.csv": manifest([r.run_dir for r in finished], out),
    }
    dest.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        if frame.columns.empty:  # nothing yet: a header CSV readers can load
            frame = pd.DataFrame(columns=["arm", "seed"])
        frame.to_csv(dest / name, index=False, float_format="%.6g")
    return [dest / name for name in RESULT_FILES]


def _earlier(path: Path) -> pd.DataFrame | None:
    """An earlier report's table, whose evaluations :func:`_known` reuses (none: ``None``)."""
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else None

"""Issue 41.4's experiment, run where the precondition search (``moestab.experiments.precondition``) found a setting
that reaches GSPO §5.3's precondition: does routing change destabilise token-level GRPO there, and does Routing
Replay or GSPO fix it? (docs/powered.md; launcher scripts/powered_experiment.py)

Two parts, both registered before any of their runs:

- **the comparison** at the search's lr, every arm on :attr:`Design.seeds`: final eval accuracy paired arm - baseline
  seed by seed (same warm-started base), the primary contrasts corrected for multiplicity by Holm's step-down;
- **the stability edge**: every arm at the lrs of :attr:`Design.edge_factors` x the search's lr on
  :attr:`Design.edge_seeds`: the share of runs that collapse (``stability.run_stability``) per arm and lr.

The routing-constant arm (``--routing-replay base``) is the main control: the same MoE, base and seeds, with routing
held at the base's; the dense policy is a secondary control.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from moestab.experiments.grid import GridRun, grid_runs, run_grid, shard
from moestab.experiments.registration import check_registered
from moestab.experiments.stability import run_stability
from moestab.metrics import keys
from moestab.metrics.paired import min_detectable_difference, paired_interval, t_cdf
from moestab.models.spec import parse_model_spec
from moestab.run_folder.reader import load_metrics, read_run_info

BASELINE = "moe_grpo_off"
ARMS: dict[str, dict[str, Any]] = {
    "moe_grpo_off": {"algo": "grpo", "routing_replay": "off"},
    "moe_grpo_r2": {"algo": "grpo", "routing_replay": "old"},
    "moe_grpo_r3": {"algo": "grpo", "routing_replay": "rollout"},
    "moe_gspo_off": {"algo": "gspo", "routing_replay": "off"},
    "constant_grpo": {"algo": "grpo", "routing_replay": "base"},
    "dense_grpo_off": {"algo": "grpo", "routing_replay": "off", "dense": True},
}
"""Arm -> its objective and replay (``dense``: the dense policy of the same depth and active width)."""
PRIMARY_CONTRASTS = ("constant_grpo", "moe_grpo_r2", "moe_grpo_r3", "moe_gspo_off")
"""Each minus :data:`BASELINE` on the primary outcome, Holm-corrected together. Reading: routing change hurts GRPO if
``constant_grpo`` is above the baseline; replay or GSPO fix it if ``moe_grpo_r2`` / ``r3`` / ``moe_gspo_off`` are."""
SECONDARY_CONTRASTS = ("dense_grpo_off",)
PRIMARY = "final_acc"


@dataclass(frozen=True)
class Design:
    """The experiment's fixed settings: the search's passing setting and everything else (tests shrink them)."""

    model: str
    lr: float
    aux: float
    task: str
    seeds: tuple[int, ...] = tuple(range(2000, 2015))
    edge_seeds: tuple[int, ...] = tuple(range(2000, 2005))
    edge_factors: tuple[float, ...] = (0.5, 2.0)
    steps: int = 100
    eval_every: int = 10
    eval_size: int = 1000
    alpha: float = 0.05
    power: float = 0.8
    assumed_sd: float = 0.05
    """The paired sd of final accuracy the power computation assumes: the upper end of the controlled experiment's
    measured 3-5 points (docs/controlled.md)."""
    extra: tuple[tuple[str, Any], ...] = ()
    """Further TrainConfig fields of every run (tests: tiny batches); registered with the rest."""
    cache_dir: str | None = field(default=None, compare=False)

    def base(self) -> dict[str, Any]:
        """TrainConfig fields every run shares: the precondition search's (bf16 rollouts, routing's share, no stop on
        zero-advantage steps, one thread), the setting, and the experiment's length and eval set."""
        return {"rollout_dtype": "bfloat16", "routing_share": True, "max_zero_advantage_steps": 0, "threads": 1,
                "task": self.task, "warm_start_aux_loss_coef": self.aux, "steps": self.steps,
                "eval_every": self.eval_every, "eval_size": self.eval_size, "cache_dir": self.cache_dir,
                **dict(self.extra)}

    def dense_model(self) -> str:
        spec = parse_model_spec(self.model)
        return f"embedded:dense,layers={spec.num_layers}" + (f",hidden={spec.hidden_size}" if spec.hidden_size != 128
                                                                else "")

    def arm_fields(self, arm: str) -> dict[str, Any]:
        fields = {k: v for k, v in ARMS[arm].items() if k != "dense"}
        return {**fields, "model": self.dense_model() if ARMS[arm].get("dense") else self.model}

    def contrast_alpha(self) -> float:
        """The level each primary contrast is powered at: Bonferroni's alpha / m (Holm is never stricter)."""
        return self.alpha / len(PRIMARY_CONTRASTS)

    def min_detectable(self) -> float:
        """The smallest true paired difference in final accuracy each primary contrast detects with :attr:`power`."""
        return min_detectable_difference(self.assumed_sd, len(self.seeds), self.contrast_alpha(), self.power)


SMOKE_EXTRA = (("prompts_per_step", 4), ("group_size", 4), ("minibatches", 2), ("save_every", 1),
               ("warm_start_max_steps", 0), ("progress", False))
"""The smoke design's tiny batches: every step saved, no warm-start training."""


def smoke_design(folder: str | Path, cache_dir: str | None = None) -> Design:
    """A tiny design that exercises every stage of an experiment built on this one and measures nothing (the
    notebooks' smoke size): 1 layer, 2 seeds, 2 steps, an eval set of 8, every reward 0 (its reward function is
    written to ``folder``), one edge seed at twice the lr."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    reward = folder / "zero_reward.py"
    reward.write_text("def always_zero(prompt, completion, answer):\n    return 0.0\n")
    return Design(model="embedded:layers=1,hidden=32", lr=1e-3, aux=0.01,
                  task=f"arithmetic:reward={reward.resolve()}:always_zero", seeds=(2000, 2001), edge_seeds=(2000,),
                  edge_factors=(2.0,), steps=2, eval_every=1, eval_size=8, extra=SMOKE_EXTRA, cache_dir=cache_dir)


def comparison_runs(design: Design, out: str | Path) -> list[GridRun]:
    """``out/comparison/<arm>/seed-<s>`` at the search's lr."""
    return [run for arm in ARMS for run in grid_runs({**design.base(), **design.arm_fields(arm), "lr": design.lr},
                                                     {}, design.seeds, Path(out) / "comparison" / arm)]


def edge_runs(design: Design, out: str | Path) -> list[GridRun]:
    """``out/edge/<arm>/lr-<lr>_seed-<s>`` at each lr of the ladder but the search's own (the comparison holds it)."""
    lrs = [design.lr * f for f in design.edge_factors]
    return [run for arm in ARMS for run in grid_runs({**design.base(), **design.arm_fields(arm)}, {"lr": lrs},
                                                     design.edge_seeds, Path(out) / "edge" / arm)]


def all_runs(design: Design, out: str | Path) -> list[GridRun]:
    return comparison_runs(design, out) + edge_runs(design, out)


def registration(design: Design) -> dict[str, Any]:
    """Everything the experiment fixes before it runs, the power computation included."""
    base = {k: v for k, v in design.base().items() if k != "cache_dir"}
    return {"design": {k: v for k, v in asdict(design).items() if k != "cache_dir"}, "base": base,
            "arms": {arm: design.arm_fields(arm) for arm in ARMS}, "baseline": BASELINE, "primary": PRIMARY,
            "primary_contrasts": list(PRIMARY_CONTRASTS), "secondary_contrasts": list(SECONDARY_CONTRASTS),
            "multiplicity": "Holm step-down over the primary contrasts at family-wise alpha",
            "min_detectable_difference": round(design.min_detectable(), 4),
            "runs": len(all_runs(design, "out"))}


def run_experiment(design: Design, out: str | Path, registered: str | Path, *, shards: tuple[int, int] = (0, 1),
                   log: Callable[[str], None] = print) -> list[Path]:
    """Every run not finished yet (the comparison first), after checking the registration; ``shards`` ``(i, n)``:
    shard ``i`` of ``n`` processes."""
    check_registered(registered, registration(design))
    return run_grid(shard(all_runs(design, out), *shards), log=log)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired_p(differences: Sequence[float]) -> float:
    """Two-sided p-value of the paired t-test that the mean of ``differences`` is 0 (NaN for fewer than 2, or sd 0
    with mean 0)."""
    n = len(differences)
    if n < 2:
        return math.nan
    ci = paired_interval(list(differences), [0.0] * n)
    if ci.sd == 0:
        return math.nan if ci.mean == 0 else 0.0
    t = ci.mean / (ci.sd / math.sqrt(n))
    return 2 * (1 - t_cdf(abs(t), n - 1))


def outcomes(runs: Sequence[GridRun]) -> pd.DataFrame:
    """One row per run: arm, lr, seed, start / final accuracy, collapse, reward gain, volatility."""
    rows = []
    for run in runs:
        m = run_stability(run.run_dir)
        arm = run.run_dir.parent.name
        rows.append({"arm": arm, "lr": run.config.lr, "seed": run.values["seed"],
                     **{k: m[k] for k in ("start_acc", "final_acc", "collapse", "reward_gain", "vol")}})
    return pd.DataFrame(rows)


def contrasts(table: pd.DataFrame, alpha: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """Per contrast arm: paired difference arm - baseline in the primary outcome, its 95% t-interval, p and Holm's
    adjusted p (primary contrasts; secondary ones are reported unadjusted), the realized sd of the paired differences
    and the minimum detectable difference it gives (``min_detectable``: at ``alpha`` / m for a primary contrast, the
    level the registration powered it at, and ``alpha`` for a secondary one; NaN below two pairs)."""
    base = table[table["arm"] == BASELINE].set_index("seed")[PRIMARY]
    rows = []
    for arm in (*PRIMARY_CONTRASTS, *SECONDARY_CONTRASTS):
        pairs = pd.concat([table[table["arm"] == arm].set_index("seed")[PRIMARY], base], axis=1,
                          keys=["arm", "base"]).dropna()
        ci = paired_interval(pairs["arm"].tolist(), pairs["base"].tolist())
        level = alpha / len(PRIMARY_CONTRASTS) if arm in PRIMARY_CONTRASTS else alpha
        detectable = (min_detectable_difference(ci.sd, ci.n, level, power) if ci.n >= 2 and ci.sd > 0
                      else math.nan)
        rows.append({"arm": arm, "n": ci.n, "mean_diff": ci.mean, "ci_low": ci.low, "ci_high": ci.high,
                     "p": paired_p((pairs["arm"] - pairs["base"]).tolist()), "primary": arm in PRIMARY_CONTRASTS,
                     "sd": ci.sd, "min_detectable": detectable})
    out = pd.DataFrame(rows)
    primary = out["primary"]
    out["p_holm"] = math.nan
    out.loc[primary, "p_holm"] = holm(out.loc[primary, "p"].tolist())
    return out


def collapse_rates(table: pd.DataFrame) -> pd.DataFrame:
    """Share of runs that collapsed, per arm and lr (the stability edge), with the number of runs."""
    grouped = table.groupby(["arm", "lr"])["collapse"]
    return pd.DataFrame({"collapse_rate": grouped.mean(), "runs": grouped.size()}).reset_index()


def curves(runs: Sequence[GridRun]) -> pd.DataFrame:
    """One row per run and evaluated step: eval accuracy there, and the mean reward and old->new routing change over
    the steps since the previous evaluation (equal windows, so a mean of windows is a mean of steps)."""
    rows = []
    for run in runs:
        m = load_metrics(run.run_dir)
        evaluated = m[keys.EVAL_ACCURACY].notna()
        window = evaluated.shift(fill_value=False).cumsum()  # steps after one evaluation up to and with the next
        means = m.groupby(window)[[keys.REWARD_MEAN, keys.ROUTING_CHANGED.format(pair="old_new")]].mean()
        for _, row in m[evaluated].iterrows():
            w = window[row.name]
            rows.append({"arm": run.run_dir.parent.name, "lr": run.config.lr, "seed": run.values["seed"],
                         "step": int(row[keys.STEP]), "eval_acc": float(row[keys.EVAL_ACCURACY]),
                         "reward": float(means.loc[w, keys.REWARD_MEAN]),
                         "vol": float(means.loc[w, keys.ROUTING_CHANGED.format(pair="old_new")])})
    return pd.DataFrame(rows)


RESULT_FILES = ("outcomes.csv", "contrasts.csv", "collapse_rates.csv", "curves.csv", "manifest.csv")


def write_results(design: Design, out: str | Path, dest: str | Path) -> list[Path]:
    """The report of every run of ``design`` under ``out`` (all finished) as :data:`RESULT_FILES` in ``dest``: per-run
    outcomes, the contrasts at the design's lr, collapse rates per arm and lr, curves and the manifest."""
    runs = all_runs(design, out)
    table = outcomes(runs)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    frames = (table, contrasts(table[table["lr"] == design.lr], design.alpha, design.power), collapse_rates(table),
              curves(runs), manifest([r.run_dir for r in runs], out))
    for name, frame in zip(RESULT_FILES, frames, strict=True):
        frame.to_csv(dest / name, index=False, float_format="%.6g" if name == "curves.csv" else None)
    return [dest / name for name in RESULT_FILES]


def manifest(folders: Sequence[Path], root: str | Path) -> pd.DataFrame:
    """Each run folder of ``folders``, relative to ``root``: sha256 of its metrics.jsonl and run.json, its created
    time, its last update (a finished run's: when it finished) and the code that wrote it (run.json
    ``environment.code``: ``commit`` and ``dirty``, empty for a run written before moestab recorded them)."""
    rows = []
    for folder in folders:
        info = read_run_info(folder)
        code = info.environment.get("code") or {}
        rows.append({"run": Path(folder).relative_to(root).as_posix(),
                     "metrics_sha256": _sha256(Path(folder) / "metrics.jsonl"),
                     "run_json_sha256": _sha256(Path(folder) / "run.json"),
                     "created": info.created, "updated": info.updated,
                     "commit": code.get("commit"), "dirty": code.get("dirty")})
    return pd.DataFrame(rows)


def run_hours(table: pd.DataFrame) -> float:
    """The measured cost of the runs a manifest lists: the sum of each run's created -> last update, in hours (one
    thread per run, so run-hours are core-hours; a run resumed after a stop counts its gap too)."""
    spans = pd.to_datetime(table["updated"]) - pd.to_datetime(table["created"])
    return float(spans.dt.total_seconds().sum() / 3600)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_problems(table: pd.DataFrame, design: Design, registered_at: str) -> list[str]:
    """What a committed manifest gets wrong: a run the design does not have or one it lacks, a malformed hash, or a
    run created before the registration (ISO-8601 strings compare in time order)."""
    expected = {r.run_dir.relative_to("out").as_posix() for r in all_runs(design, "out")}
    have = set(table["run"])
    problems = [f"not in the design: {r}" for r in sorted(have - expected)]
    problems += [f"missing: {r}" for r in sorted(expected - have)]
    for row in table.itertuples(index=False):
        for digest in (row.metrics_sha256, row.run_json_sha256):
            if len(str(digest)) != 64 or any(c not in "0123456789abcdef" for c in str(digest)):
                problems.append(f"{row.run}: {digest!r} is not a sha256")
        if str(row.created) < registered_at:
            problems.append(f"{row.run}: created {row.created}, before the registration ({registered_at})")
    return problems

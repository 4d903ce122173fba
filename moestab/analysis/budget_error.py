"""How small a measurement budget may be: the sampling error of a change rate at each budget fraction, set against
how much the rate moves from step to step, from a run measured in full.

Per step, each group's (prompt's) decisions ``x_g`` and changed ones ``y_g`` are counted from the per-token tables;
measuring ``m = max(1, ceil(f M))`` of the ``M`` groups then has the expected standard error of the ratio estimate
(Cochran, *Sampling Techniques*, eq. 6.9, with the population's own spread):

    se(f)^2 = (1 - m / M) / (m * xbar^2) * sum_g (y_g - R x_g)^2 / (M - 1)

:func:`moestab.metrics.sampling.ratio_se` estimates the same from one sample; a budget's fraction is adequate when
se(f) is small beside the step-to-step spread of the rate (``scripts/choose_budget.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from moestab.metrics.routes import intersection_sizes, route_change
from moestab.metrics.sampling import ratio_se, sample_groups
from moestab.run_folder import schema
from moestab.run_folder.reader import iter_run_routes, read_run_info


def group_counts(run: str | Path, pair: str = "old_new", stat: str = "router_flip") -> pd.DataFrame:
    """Per ``step`` and ``prompt`` (group): ``decisions`` and ``changed`` (decisions counted by ``stat``:
    ``router_flip`` flipped decisions, ``changed`` changed expert slots / top_k) of route pair ``pair``, from the
    run's per-token tables. Groups are whole only when the tables hold every sequence (``--record-fraction 1``)."""
    if stat not in ("router_flip", "changed"):
        raise ValueError(f"stat must be router_flip or changed, got {stat!r}")
    info = read_run_info(run)
    col_a, col_b = schema.ROUTE_PAIRS[pair]
    frames = []
    for step, batch, routes in iter_run_routes(run, [col_a, col_b], info.top_k, [schema.COL_PROMPT],
                                               num_experts=info.num_experts):
        prompt = batch.column(schema.COL_PROMPT).to_numpy()  # [tokens]
        ids, group = np.unique(prompt, return_inverse=True)
        inter = intersection_sizes(routes[col_a], routes[col_b], threads=1)  # [tokens, layers]
        rates = route_change(inter, info.top_k, group, len(ids))
        decisions = rates["routers"]  # [groups]
        frames.append(pd.DataFrame({"step": step, "prompt": ids, "decisions": decisions,
                                    "changed": rates[stat] * decisions}))
    columns = ["step", "prompt", "decisions", "changed"]
    counts = pd.concat(frames) if frames else pd.DataFrame(columns=columns)
    return counts.groupby(["step", "prompt"], as_index=False)[["decisions", "changed"]].sum()


def expected_se(y: np.ndarray, x: np.ndarray, fraction: float) -> float:
    """Expected standard error of ``sum y / sum x`` when ``fraction`` of the ``M = len(x)`` groups ``y``, ``x``
    ``[M]`` are measured (the budget's count, at least one group): 0 at fraction 1, NaN for one group."""
    y, x = np.asarray(y, np.float64), np.asarray(x, np.float64)
    M = len(x)
    m = max(1, math.ceil(fraction * M - 1e-9))
    if m >= M:
        return 0.0
    if M < 2:
        return math.nan
    ratio = y.sum() / x.sum()
    residual = y - ratio * x  # [M]
    return float(math.sqrt((1 - m / M) / (m * x.mean() ** 2) * (residual @ residual) / (M - 1)))


def budget_errors(counts: pd.DataFrame, fractions: Sequence[float], seed: int = 0) -> pd.DataFrame:
    """One row per step of ``counts`` (:func:`group_counts`): the rate measured in full (``value``), and per
    fraction ``f`` its expected sampling error ``se_<f>`` and the error :func:`ratio_se` estimates from the sample
    the budget's own rule draws with ``seed + step`` (``drawn_se_<f>``, with that sample's rate ``drawn_<f>``)."""
    rows = []
    for step, g in counts.groupby("step"):
        y, x = g["changed"].to_numpy(np.float64), g["decisions"].to_numpy(np.float64)  # [M] each
        row: dict[str, float] = {"step": int(step), "groups": len(x), "value": y.sum() / x.sum()}
        for f in fractions:
            pick = sample_groups(len(x), f, seed + int(step)).numpy()  # [m] the budget's own rule
            row[f"se_{f:g}"] = expected_se(y, x, f)
            row[f"drawn_{f:g}"] = y[pick].sum() / x[pick].sum()
            row[f"drawn_se_{f:g}"] = ratio_se(y[pick], x[pick], len(x))
        rows.append(row)
    return pd.DataFrame(rows)


def budget_choice(errors: pd.DataFrame, fractions: Sequence[float], ratio: float = 0.1) -> pd.DataFrame:
    """Per fraction: the largest expected sampling error over the steps, the step-to-step spread of the full
    rate (standard deviation over steps), their quotient and whether it is below ``ratio``."""
    spread = float(errors["value"].std(ddof=1))
    out = []
    for f in fractions:
        worst = float(errors[f"se_{f:g}"].max())
        out.append({"fraction": f, "max_se": worst, "mean_se": float(errors[f"se_{f:g}"].mean()),
                    "spread": spread, "se_over_spread": worst / spread, "ok": worst < ratio * spread})
    return pd.DataFrame(out)


def every_errors(values: pd.Series, everies: Sequence[int]) -> pd.DataFrame:
    """What measuring one step in ``N`` costs a run's mean, from a run measured on every step: ``values`` is a
    metric per step (index: step 1..T). Per ``N``: the steps a budget of ``every N`` measures (1, 1 + N, ...), the
    error of their mean against the all-step mean (``error``), and over the ``N`` possible first steps the root mean
    square of that error (``rms_error``: what the choice of phase could have given). A measured step itself has no
    sampling error (every sequence of it is scored)."""
    values = values.sort_index().astype(np.float64)
    full = float(values.mean())
    steps = values.index.to_numpy()
    out = []
    for n in everies:
        phases = [values[(steps - 1) % n == phase] for phase in range(n)]
        errors = np.array([float(p.mean()) - full for p in phases if len(p)])  # [phases]
        out.append({"every": n, "measured_steps": len(phases[0]), "run_mean": full,
                    "error": float(phases[0].mean()) - full, "rms_error": float(np.sqrt((errors**2).mean())),
                    "spread": float(values.std(ddof=1))})
    return pd.DataFrame(out)

"""The budget analysis: the expected sampling error of a change rate at a budget fraction (what
scripts/choose_budget.py sets against the step-to-step spread)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.budget_error import budget_choice, budget_errors, every_errors, expected_se
from moestab.metrics.sampling import sample_groups


def test_expected_se_hand_worked():
    # 4 groups, y = [0, 2, 2, 4] changed of x = [10] * 4: R = 8 / 40 = 0.2, residuals y - R x = [-2, 0, 0, 2],
    # sum of squares 8, / (M - 1) = 8 / 3. Half measured (m = 2): (1 - 2/4) / (2 * 100) * 8/3 = 1/150,
    # se = 0.0816497.
    y, x = np.array([0, 2, 2, 4.0]), np.full(4, 10.0)
    assert expected_se(y, x, 0.5) == pytest.approx(math.sqrt(1 / 150), rel=1e-12)
    assert expected_se(y, x, 1.0) == 0.0


def test_expected_se_is_the_spread_of_the_budgets_own_draws():
    # A second implementation: the standard deviation of the rate over 3,000 draws of the budget's rule.
    rng = np.random.default_rng(1)
    x = rng.integers(40, 120, 32).astype(float)
    y = rng.binomial(x.astype(int), rng.uniform(0.0, 0.06, 32)).astype(float)
    draws = [y[p].sum() / x[p].sum() for p in (sample_groups(32, 0.25, s).numpy() for s in range(3000))]
    assert expected_se(y, x, 0.25) == pytest.approx(np.std(draws), rel=0.08)


def test_budget_choice_passes_only_errors_below_a_tenth_of_the_spread():
    counts = pd.DataFrame({"step": np.repeat([1, 2, 3], 4), "prompt": np.tile(range(4), 3),
                           "decisions": 10.0, "changed": [0, 2, 2, 4, 1, 1, 1, 1, 3, 3, 3, 3.0]})
    errors = budget_errors(counts, (0.5, 1.0))
    assert errors.value.tolist() == pytest.approx([0.2, 0.1, 0.3])  # 8/40, 4/40, 12/40
    choice = budget_choice(errors, (0.5, 1.0)).set_index("fraction")
    assert choice.loc[0.5, "spread"] == pytest.approx(0.1)  # sd of 0.2, 0.1, 0.3
    assert choice.loc[0.5, "max_se"] == pytest.approx(math.sqrt(1 / 150))  # step 1's; steps 2-3 have no spread
    assert not choice.loc[0.5, "ok"] and choice.loc[1.0, "ok"]


def test_every_errors_is_the_error_of_the_run_mean_from_every_nth_step():
    values = pd.Series([1.0, 2.0, 3.0, 4.0, 10.0], index=[1, 2, 3, 4, 5])  # mean 4
    table = every_errors(values, [1, 2, 3]).set_index("every")
    assert table.loc[1, "measured_steps"] == 5 and table.loc[1, "error"] == 0 and table.loc[1, "rms_error"] == 0
    # every 2: steps 1, 3, 5 (mean 14 / 3) -> +2/3; the other phase, steps 2, 4 (mean 3) -> -1
    assert table.loc[2, "measured_steps"] == 3
    assert table.loc[2, "error"] == pytest.approx(2 / 3)
    assert table.loc[2, "rms_error"] == pytest.approx(((4 / 9 + 1) / 2) ** 0.5)
    # every 3: steps 1, 4 (mean 2.5) -> -1.5; phases 2, 5 (6) -> +2 and 3 (3) -> -1
    assert table.loc[3, "error"] == pytest.approx(-1.5)
    assert table.loc[3, "rms_error"] == pytest.approx(((2.25 + 4 + 1) / 3) ** 0.5)
    assert table.loc[3, "spread"] == pytest.approx(values.std(ddof=1))

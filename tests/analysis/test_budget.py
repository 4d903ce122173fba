"""The budget analysis: the expected sampling error of a change rate at a budget fraction (what
scripts/choose_budget.py sets against the step-to-step spread)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moestab.analysis.budget import budget_choice, budget_errors, expected_se
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

"""moestab.analysis.labels: every scalar key has a title and a unit in words, shares are in percent as README writes
them, and a value at float precision is written as zero."""

from __future__ import annotations

import math

import pytest

from moestab.analysis.labels import (
    AT_PRECISION,
    LABELS,
    at_float_precision,
    format_value,
    is_percent,
    metric_label,
)
from moestab.metrics import keys


def test_every_scalar_key_has_a_readable_label() -> None:
    scalar = [row for row in keys.TABLE if row.kind in (keys.FLOAT, keys.INT) and row.pattern != keys.STEP]
    assert {row.pattern for row in scalar} == set(LABELS), "give every scalar key a (title, unit) in LABELS"
    for row in scalar:
        for key in row.keys:
            label = metric_label(key)
            # No formula and no raw key: words, with a unit.
            assert "`" not in label.title and "{" not in label.title and "/" not in label.title, (key, label)
            assert label.unit and "`" not in label.unit, (key, label)


def test_labels_name_the_pair_and_shares_are_percent() -> None:
    label = metric_label("routing/old_new/changed")
    assert (label.title, label.unit) == ("Routing change old → new", "% of routed slots")
    assert metric_label("mismatch/rollout_old/k3").title == "Mismatch rollout → trainer (pi_old as used), k3 estimate"
    assert metric_label("ratio/token_q0.99").title == "Token ratio w, quantile 0.99"
    # README writes routing change, flips, accuracies and clip shares in percent, k3 and variances as numbers.
    for key in ("routing/old_new/changed", "routing/rollout_old_free/router_flip", "routing/old_new/token_flip",
                "eval/accuracy", "accuracy", "clip/token_frac_later", "clip/seq_frac_later"):
        assert is_percent(key), key
    for key in ("mismatch/rollout_old/k3", "ratio/token_log_var", "reward/mean", "time/step_s"):
        assert not is_percent(key), key
    other = metric_label("trl/custom")  # another trainer's key: its name, nothing invented
    assert (other.title, other.unit, other.percent) == ("trl/custom", "value", False)


def test_float_precision_and_the_text_of_a_value() -> None:
    assert at_float_precision(1.3e-13) and at_float_precision(-4e-10)
    assert not at_float_precision(2e-9) and not at_float_precision(math.nan)
    assert not at_float_precision(0.0) and format_value(0.0) == "0" and format_value(0.0, percent=True) == "0%"
    assert format_value(1.3e-13) == AT_PRECISION == "0 (at float precision)"
    assert format_value(1.3e-13, percent=True) == AT_PRECISION
    assert format_value(0.142, percent=True) == "14.2%"  # README's "14.2%"
    assert format_value(0.0094, percent=True) == "0.94%"
    assert format_value(0.00451, percent=True) == "0.451%"
    assert format_value(4.65e-4) == "4.65e-04" and format_value(0.0123) == "0.0123" and format_value(12.34) == "12.3"
    assert format_value(0.0123, percent=True, difference=True) == "+1.23 pp"
    assert format_value(-0.0123, percent=True, difference=True) == "-1.23 pp"
    assert format_value(-2.5e-5, difference=True) == "-2.50e-05"
    assert format_value(math.nan) == "" and format_value(None) == ""  # nothing applies: blank, not 0


@pytest.mark.parametrize("value", [0.123456, 3.3e-6, 0.5, 1.0, 2.0e-3])
def test_the_text_holds_three_significant_digits(value: float) -> None:
    shown = format_value(value, percent=True)
    assert float(shown.rstrip("%")) / 100 == pytest.approx(value, rel=5e-3)

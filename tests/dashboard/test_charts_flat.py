"""A chart whose values are all 0, or 0 up to float rounding (k3 under R3: ~1e-13), is said in words, not drawn as
signal on a scale of its own (issue 54.7)."""

from __future__ import annotations

import pandas as pd

from moestab.dashboard.kit.charts import flat


def test_float_noise_and_zeros_are_flat_and_signal_is_not():
    assert flat(pd.DataFrame({"value": [0.0, 0.0, None]}), "value") == "0 at every point"
    assert flat(pd.DataFrame({"value": [1e-13, -3e-14, 0.0]}), "value").startswith("0 at float precision")
    assert flat(pd.DataFrame({"value": [1e-13, 2e-4]}), "value") is None  # one real value: draw it
    assert flat(pd.DataFrame({"value": [None]}), "value") is None  # nothing at all: the page says so itself
    assert flat(pd.DataFrame({"other": [0.0]}), "value") is None

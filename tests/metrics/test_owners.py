"""One owner for the clip fraction and for log s, and the places that call them agree with it.

- Clip fractions: :func:`moestab.metrics.clipping.clipped_fraction`, called by the loss's per-minibatch diagnostics
  (torch) and by the step's ``clip/*`` metrics (numpy). On the same rows the two give the same number, bit for bit.
- log s: :func:`moestab.metrics.ratios.sequence_log_ratios` for every measurement (step metrics, ``moestab
  analyze``, the dashboard); the loss keeps its differentiable torch form (``moestab.rl.ratios``), checked equal.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moestab import rl
from moestab.analysis.ratios import sequence_log_s
from moestab.metrics.clipping import clipped_fraction
from moestab.metrics.ratios import clip_fractions, sequence_log_ratios
from tests.support.rl import random_batch


def flat(batch: dict[str, torch.Tensor], per_token: torch.Tensor) -> np.ndarray:
    """``[batch, seq]`` -> ``[tokens]`` at the response tokens, row-major (the step metrics' layout)."""
    return per_token[batch["mask"]].detach().numpy()


def rows_of(batch: dict[str, torch.Tensor]) -> np.ndarray:
    """``[tokens]`` the row of each response token."""
    mask = batch["mask"]
    return flat(batch, torch.arange(mask.shape[0])[:, None].expand(mask.shape))


@pytest.mark.parametrize(("algo", "level", "unit_key"), [("grpo", "token", "clip/token_frac"),
                                                         ("gspo", "sequence", "clip/frac")])
def test_the_losses_clip_fractions_are_the_steps_on_the_same_rows(algo, level, unit_key):
    preset = rl.get_preset(algo)
    batch = random_batch(7, 24, 10, scale=0.3)
    kwargs = {**preset.loss_kwargs(), "clip_low": 0.05, "clip_high": 0.05}  # some units clip, some do not
    parts = rl.compute_loss_parts(preset.loss, **kwargs, **batch)
    clipped = flat(batch, parts.clipped)
    step = clip_fractions(clipped, rows_of(batch), np.zeros(clipped.size, np.int64))
    assert parts.metrics["clip/token_frac"].item() == step["token_frac"]  # float64 loss: one division, same bits
    # A sequence-level loss clips whole sequences: its unit fraction is the step's share of sequences.
    assert parts.metrics[unit_key].item() == (step["seq_frac"] if level == "sequence" else step["token_frac"])
    assert 0 < step["token_frac"] < 1 and 0 < step["seq_frac"] < 1  # both branches ran: the check can fail


def test_clipped_fraction_is_the_same_number_for_numpy_and_torch_and_in_float32():
    gen = np.random.default_rng(0)
    for size in (1, 7, 1000, 70_000):
        flags, valid = gen.random(size) < gen.random(), gen.random(size) < 0.9
        expected = (flags & valid).sum() / valid.sum()  # float64
        as_torch = clipped_fraction(torch.from_numpy(flags), torch.from_numpy(valid))
        assert clipped_fraction(flags, valid) == expected == as_torch.item()
        # The loss's float32 diagnostics: dividing the counts in float64 and rounding to float32 gives the float32
        # quotient (53 >= 2 * 24 + 2 bits: the double rounding is innocuous), i.e. what the loss computed before.
        f32 = (torch.from_numpy(flags & valid).sum().float() / torch.from_numpy(valid).sum().float()).item()
        assert as_torch.float().item() == f32
    assert np.isnan(clipped_fraction(np.ones(3, bool), np.zeros(3, bool)))
    assert torch.isnan(clipped_fraction(torch.ones(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)))


def test_log_s_of_the_loss_is_the_measurements():
    batch = random_batch(3, 32, 17, scale=0.5)  # float64, rows of 1..17 tokens
    loss_side = rl.sequence_log_ratios(batch["logp"], batch["old_logp"], batch["mask"]).detach().numpy()  # [B]
    log_w = flat(batch, batch["logp"] - batch["old_logp"])
    measured = sequence_log_ratios(log_w, rows_of(batch))  # rows in order of first appearance: 0..B-1
    # Sums of <= 17 float64 terms of size < 3 in another order: they differ by a few ulps at most.
    np.testing.assert_allclose(measured, loss_side, rtol=0, atol=1e-14)
    assert np.abs(loss_side).max() > 0.05  # not trivially zero


def test_analyze_reads_log_s_from_the_owner():
    tokens = pd.DataFrame({"step": [2, 2, 1, 1, 1], "seq": [0, 0, 3, 3, 0], "log_w": [0.5, -0.25, 0.1, 0.2, -1.0]})
    table = sequence_log_s(tokens)  # sorted by (step, seq)
    assert table[["step", "seq"]].values.tolist() == [[1, 0], [1, 3], [2, 0]]
    ids = tokens["step"].to_numpy() * (1 << 32) + tokens["seq"].to_numpy()
    owner = dict(zip(pd.unique(ids), sequence_log_ratios(tokens["log_w"].to_numpy(), ids), strict=True))
    assert table["log_s"].tolist() == [owner[(1 << 32) + 0], owner[(1 << 32) + 3], owner[2 << 32]]
    assert table["log_s"].tolist() == pytest.approx([-1.0, 0.15, 0.125])

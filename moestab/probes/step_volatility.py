"""How much one RL step moves the routes, at each learning rate and minibatch count, from one checkpoint.

Every setting starts from a fresh copy of the same weights and a fresh optimizer and runs the same step
(:mod:`moestab.probes.one_step`: ``moestab train``'s first step with ``seed``, routing replay off), so the rollout
batch is identical in every setting and only the learning rate and the number of updates on it differ.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Sequence

import pandas as pd
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.metrics import keys
from moestab.probes.one_step import STEP_COLUMNS, StepRecipe, one_step, require_signal, step_row


def step_volatility(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: StepRecipe, *, lrs: Sequence[float],
    minibatch_counts: Sequence[int], label: str = "checkpoint", progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Two tables, each row one setting (``lr``, ``minibatches``):

    - ``step_volatility``: the columns of :data:`~moestab.probes.one_step.STEP_COLUMNS` (old->new changed, router
      and token flip; log-ratio variances; clip fractions; reward, nonzero advantages, grad norm);
    - ``step_volatility_by_minibatch``: per ``minibatch`` (0-based), ``update_old_changed``, how far that update
      forward's free routes had drifted from pi_old's (``routing/update_old/changed_by_minibatch``; 0 for the
      first, which updates from pi_old's own weights).

    ``model`` is left unchanged. Raises :class:`ProbeError` when the step has no learning signal (every advantage 0).
    """
    settings = list(itertools.product(lrs, minibatch_counts))
    for n in dict.fromkeys(minibatch_counts):  # refuse a count that does not divide the batch before any step
        recipe.step_settings(n)
    rows, by_minibatch = [], []
    for lr, n in tqdm(settings, desc="step-volatility", unit="step", disable=not progress, file=sys.stderr):
        metrics = one_step(copy.deepcopy(model), tokenizer, recipe, lr=lr, minibatches=n)
        require_signal(metrics, label)  # the same rollout in every setting: the first step decides
        rows.append({"lr": lr, "minibatches": n, **step_row(metrics)})
        by_minibatch += [{"lr": lr, "minibatches": n, "minibatch": m, "update_old_changed": changed}
                         for m, changed in enumerate(metrics[keys.ROUTING_UPDATE_DRIFT])]
    columns = ["lr", "minibatches", *STEP_COLUMNS]
    return {"step_volatility": pd.DataFrame(rows, columns=columns),
            "step_volatility_by_minibatch": pd.DataFrame(by_minibatch, columns=["lr", "minibatches", "minibatch",
                                                                                "update_old_changed"])}

"""Routing volatility of one RL update against depth: embedded policies of each layer count, one step each.

Token flip (a token with at least one flipped layer) grows with depth at a constant router flip (the share of
flipped routers): independent layers alone give ``1 - (1 - p)^L``; flips that fall on the same tokens (one
layer's flip changing what later layers route) give less at the same ``p``. Each
depth gets the embedded policy ``model`` with ``layers=N`` and runs one step with a single update
(:mod:`moestab.probes.one_step`, minibatches = 1); ``depth_by_layer`` shows where in the stack the routes moved.
Both flips are one update's (old->new) and, on the same tokens, the rollout engine's against the trainer's
(rollout->trainer, in the recipe's ``rollout_dtype``); :mod:`moestab.analysis.depth` reads them against the
independent-layer baseline ``1 - (1 - p)^L``.

Starting weights, chosen by ``warm_start``:

- off (default): freshly initialised with ``seed``, the weights ``moestab train`` would warm-start from. Cheap at
  every depth; the policy answers nothing right, so the task's reward must vary for a random policy (a ``reward=``
  function) or the step has no signal and the probe says so.
- on: the supervised warm start of ``moestab train --model embedded:layers=N --task T --seed S`` (same cache entry,
  so a base built once by either is reused). Building one runs up to ``TrainConfig.warm_start_max_steps`` steps on
  one thread: about 1, 1.5, 3 and 6 minutes at 2, 4, 8 and 16 layers on a 2-core CPU (per-step time measured
  x 1,500 steps).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from moestab.metrics import keys
from moestab.models import build_embedded_policy, is_embedded, parse_model_spec
from moestab.models.spec import MODEL_SPEC_GRAMMAR
from moestab.probes.checkpoints import Checkpoint, check_dtype, load_checkpoint
from moestab.probes.errors import ProbeError
from moestab.probes.one_step import StepRecipe, one_step, require_signal, step_row
from moestab.routing import find_routers
from moestab.tasks.spec import parse_spec
from moestab.train.config import TrainConfig
from moestab.train.recipe import base_policy_path

logger = logging.getLogger(__name__)
"""The warm starts' notes, with ``progress`` (``moestab probe depth`` shows them on stderr)."""

MAX_LAYERS = 64
"""Deepest policy the probe builds (a guard against typos such as 160 for 16)."""
DEPTH_COLUMNS = ("old_new_changed", "old_new_router_flip", "old_new_token_flip", "rollout_old_router_flip",
                 "rollout_old_token_flip", "reward_mean", "advantage_nonzero_frac", "grad_norm")
"""Columns of ``STEP_COLUMNS`` the depth table keeps: with one update the ratio is 1 and nothing clips. The
``rollout_old`` flips compare the rollout engine's routes with the trainer's pi_old on the same tokens: 0 up to
float rounding when the engine runs the policy's own precision, the rollout->trainer gap R3 measures with a
``StepRecipe(rollout_dtype="bfloat16")``."""


def check_depth_settings(layers: Sequence[int], model: str) -> None:
    """Refuse layer counts outside 1..:data:`MAX_LAYERS` or repeated, and a ``model`` that is not an embedded spec
    or that sets ``layers`` itself."""
    if not layers:
        raise ProbeError(f"layers: give at least one layer count; valid: integers 1 to {MAX_LAYERS}")
    bad = [n for n in layers if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LAYERS]
    if bad:
        raise ProbeError(f"layers {bad} are not valid; valid: integers 1 to {MAX_LAYERS}")
    if len(set(layers)) != len(layers):
        raise ProbeError(f"layers {list(layers)} repeat a count; give each depth once")
    if not is_embedded(model):
        raise ProbeError(f"model {model!r}: depth builds embedded policies; valid: {MODEL_SPEC_GRAMMAR}, "
                         "without layers")
    try:
        parse_model_spec(model)
        _, params = parse_spec(model, "model", MODEL_SPEC_GRAMMAR)
    except ValueError as exc:
        raise ProbeError(f"model: {exc}") from None
    if "layers" in params:
        raise ProbeError(f"model {model!r} sets layers; the probe sets them from --layers, so leave it out")


def with_layers(model: str, layers: int) -> str:
    """The embedded spec ``model`` with ``layers=N`` (``embedded`` -> ``embedded:layers=N``)."""
    return f"{model}{',' if ':' in model else ':'}layers={layers}"


def _policy(
    spec: str, recipe: StepRecipe, *, warm_start: bool, cache_dir: str | None, dtype: str, device: str,
    log: Callable[[str], None],
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, float | None]:
    """The policy of embedded ``spec`` (fresh or warm-started, see the module docstring) and its warm-start
    accuracy (``None`` when fresh)."""
    if not warm_start:
        model, tokenizer = build_embedded_policy(parse_model_spec(spec, seed=recipe.seed))
        return model.to(device=device, dtype=check_dtype(dtype)), tokenizer, None
    config = TrainConfig(model=spec, task=recipe.task.spec, seed=recipe.seed, cache_dir=cache_dir, progress=False)
    path, record = base_policy_path(config, recipe.task, log)
    model, tokenizer = load_checkpoint(Checkpoint(spec, Path(path)), dtype=dtype, device=device)
    return model, tokenizer, float(record["accuracy"]) if record else None


def depth(
    recipe: StepRecipe, *, layers: Sequence[int], lr: float, model: str = "embedded", warm_start: bool = False,
    cache_dir: str | None = None, dtype: str = "float32", device: str = "cpu", progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Two tables:

    - ``depth``: one row per ``depth`` (MoE layers) with the columns of :data:`DEPTH_COLUMNS` and
      ``warm_start_accuracy`` (NaN for fresh weights);
    - ``depth_by_layer``: per depth and ``layer`` (decoder-layer index of each MoE layer), ``changed`` from pi_old
      to pi_new (``routing/old_new/changed_by_layer``).

    Raises :class:`ProbeError` for bad ``layers`` / ``model`` (before any policy is built) and at the first depth
    whose step has no learning signal (every advantage 0).
    """
    check_depth_settings(layers, model)
    recipe.step_settings(1)
    log = logger.info if progress else (lambda message: None)
    rows, by_layer = [], []
    for n in tqdm(layers, desc="depth", unit="depth", disable=not progress, file=sys.stderr):
        policy, tokenizer, accuracy = _policy(with_layers(model, n), recipe, warm_start=warm_start,
                                              cache_dir=cache_dir, dtype=dtype, device=device, log=log)
        moe_layers = [site.layer for site in find_routers(policy)]
        metrics = one_step(policy, tokenizer, recipe, lr=lr, minibatches=1)
        require_signal(metrics, f"depth {n}")
        rows.append({"depth": n, **step_row(metrics, DEPTH_COLUMNS), "warm_start_accuracy": accuracy})
        changed_by_layer = metrics[keys.ROUTING_CHANGED_BY_LAYER.format(pair="old_new")]
        by_layer += [{"depth": n, "layer": layer, "changed": changed}
                     for layer, changed in zip(moe_layers, changed_by_layer, strict=True)]
    return {"depth": pd.DataFrame(rows, columns=["depth", *DEPTH_COLUMNS, "warm_start_accuracy"]).astype(
                {"warm_start_accuracy": float}),
            "depth_by_layer": pd.DataFrame(by_layer, columns=["depth", "layer", "changed"])}

"""Algorithm presets: the published (or, where marked, chosen) loss settings of each algorithm by name.

A preset only names registered pieces (``loss`` in ``moestab.rl.registry.LOSSES``, ``advantage`` in
``moestab.rl.advantages.ADVANTAGE_ESTIMATORS``) and fixes their scalar settings, including a loss's own ones (each
the field of the same name, e.g. ``gamma_min``); it holds no tensors and runs no math. Dynamic sampling, overlong
shaping, minibatching etc. are training-loop features, not presets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from moestab.rl.advantages import ADVANTAGE_ESTIMATORS
from moestab.rl.aggregation import AGGREGATION_INPUTS, AGGREGATIONS
from moestab.rl.errors import lookup
from moestab.rl.objectives import LEVELS, Objective
from moestab.rl.registry import LOSSES


@dataclass(frozen=True)
class AlgorithmPreset:
    """Loss settings of one RL algorithm."""

    name: str
    """Algorithm name, the key in ``PRESETS``."""
    loss: str
    """Registered policy loss (``LOSSES``)."""
    level: str
    """Ratio level the loss clips: ``token`` | ``sequence`` | ``sequence-token``."""
    clip_low: float
    """Lower clip parameter: ratio bound ``1 - clip_low`` (GMPO: log-ratio bound ``-clip_low``)."""
    clip_high: float
    """Upper clip parameter: ratio bound ``1 + clip_high`` (GMPO: log-ratio bound ``+clip_high``)."""
    aggregation: str
    """Loss aggregation (``moestab.rl.aggregation.AGGREGATIONS``)."""
    advantage: str
    """Advantage estimator (``ADVANTAGE_ESTIMATORS``)."""
    citation: str
    """One-line source of the algorithm and of the numbers above."""
    kl_coef: float = 0.0
    """Coefficient of the k3 penalty against a reference policy; 0 in every preset (no reference model)."""
    gamma_min: float | None = None
    """RSPO only: floor of the router-shift weight; None for every other loss."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: train only on groups whose rewards differ (a training-loop setting the
    algorithm prescribes)."""
    overlong_cache_fraction: float | None = None
    """DAPO's overlong reward shaping: ``L_cache`` as a fraction of the maximum response length (``None``: off);
    a training-loop setting that the algorithm prescribes (``moestab.rl.shaping``)."""

    def __post_init__(self) -> None:
        loss = lookup(LOSSES, self.loss, "policy loss")
        lookup(ADVANTAGE_ESTIMATORS, self.advantage, "advantage estimator")
        lookup({name: None for name in LEVELS}, self.level, "level")
        lookup({name: None for name in AGGREGATIONS}, self.aggregation, "aggregation")
        for field_name in ("clip_low", "clip_high", "kl_coef"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"preset {self.name!r}: {field_name} must be finite and >= 0, got {value}")
        if self.overlong_cache_fraction is not None and not 0 < self.overlong_cache_fraction <= 1:
            raise ValueError(f"preset {self.name!r}: overlong_cache_fraction must be in (0, 1]")
        own_fields = {f.name for f in fields(self) if f.default is None}  # the optional settings
        for name in loss.settings:
            if name not in own_fields:
                raise ValueError(f"loss {self.loss!r} takes the setting {name!r}, which no preset field fixes: add "
                                 f"an optional field {name!r} (default None) to AlgorithmPreset")
        # A loss's own setting (e.g. gamma_min) is given exactly in the presets of the losses that take it.
        for name in sorted({name for registered in LOSSES.values() for name in registered.settings}):
            if (name in loss.settings) != (getattr(self, name, None) is not None):
                takers = ", ".join(repr(o.name) for o in LOSSES.values() if name in o.settings)
                raise ValueError(f"preset {self.name!r}: {name} is required for loss {takers} and only for it")

    @property
    def objective(self) -> Objective:
        """The registered loss this preset names, with what it declares (levels, ``log_space``, inputs)."""
        return LOSSES[self.loss]

    def loss_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``compute_policy_loss`` that this preset fixes.

        ``level``, ``clip_low``, ``clip_high``, ``aggregation``, ``kl_coef``, plus the loss's own settings
        (``Objective.settings``: ``gamma_min`` for RSPO).
        """
        kwargs: dict[str, Any] = {
            "level": self.level,
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "aggregation": self.aggregation,
            "kl_coef": self.kl_coef,
        }
        kwargs.update({name: getattr(self, name) for name in self.objective.settings})
        return kwargs

    @property
    def runtime_inputs(self) -> tuple[str, ...]:
        """Keyword arguments the trainer must supply at call time besides logp/old_logp/advantages/mask.

        Declared by the pieces themselves: the aggregation's (``AGGREGATION_INPUTS``: ``norm_constant`` for
        ``seq-mean-token-sum-norm``), the loss's (``Objective.runtime_inputs``: ``router_logp_new``/
        ``router_logp_old`` for RSPO), and ``ref_logp`` when ``kl_coef > 0``.
        """
        needed = [*AGGREGATION_INPUTS.get(self.aggregation, ())]
        needed += self.objective.runtime_inputs
        if self.kl_coef > 0:
            needed.append("ref_logp")
        return tuple(needed)


_PRESET_LIST = (
    AlgorithmPreset(
        name="grpo",
        loss="ppo-clip",
        level="token",
        clip_low=0.2,
        clip_high=0.27,
        aggregation="seq-mean-token-mean",
        advantage="group-normalized",
        citation="GRPO, Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300); clip (0.2, 0.27) as the GRPO "
        "baseline of GSPO §5.1 (arXiv 2507.18071)",
    ),
    AlgorithmPreset(
        name="gspo",
        loss="ppo-clip",
        level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
        aggregation="seq-mean-token-mean",
        advantage="group-normalized",
        citation="GSPO, Zheng et al. 2025 (arXiv 2507.18071), Eq. 5-7; clip (3e-4, 4e-4) from §5.1",
    ),
    AlgorithmPreset(
        name="gspo-token",
        loss="ppo-clip",
        level="sequence-token",
        clip_low=3e-4,
        clip_high=4e-4,
        aggregation="seq-mean-token-mean",
        advantage="group-normalized",
        citation="GSPO-token, Zheng et al. 2025 (arXiv 2507.18071), Eq. 13-14; GSPO's clip (3e-4, 4e-4)",
    ),
    AlgorithmPreset(
        name="dapo",
        loss="ppo-clip",
        level="token",
        clip_low=0.2,
        clip_high=0.28,
        aggregation="token-mean",
        advantage="group-normalized",
        dynamic_sampling=True,
        overlong_cache_fraction=4096 / 20480,
        citation="DAPO, Yu et al. 2025 (arXiv 2503.14476): token-mean loss, clip-higher (0.2, 0.28); overlong "
        "shaping with L_cache = 4,096 of L_max = 20,480 (a fifth); dynamic sampling",
    ),
    AlgorithmPreset(
        name="dr-grpo",
        loss="ppo-clip",
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        aggregation="seq-mean-token-sum-norm",
        advantage="group-centered",
        citation="Dr. GRPO, Liu et al. 2025 (arXiv 2503.20783): r - mean(r), loss / constant; PPO clip 0.2",
    ),
    AlgorithmPreset(
        name="cispo",
        loss="cispo",
        level="token",
        clip_low=1.0,
        clip_high=4.0,
        aggregation="token-mean",
        advantage="group-normalized",
        citation="CISPO, MiniMax-M1 (arXiv 2506.13585); no lower bound, weight cap eps_max = 5 (1 + 4.0) "
        "as in ScaleRL (arXiv 2510.13786) and TRL's recommended epsilon_high",
    ),
    AlgorithmPreset(
        name="gmpo",
        loss="gmpo",
        level="token",
        clip_low=0.4,
        clip_high=0.4,
        aggregation="seq-mean-token-mean",
        advantage="group-normalized",
        citation="GMPO, Zhao et al. 2025 (arXiv 2507.20673): geometric mean, token clip (e^-0.4, e^0.4)",
    ),
    AlgorithmPreset(
        name="rspo",
        loss="rspo",
        level="token",
        clip_low=0.2,
        clip_high=0.27,
        aggregation="seq-mean-token-mean",
        advantage="group-normalized",
        gamma_min=0.1,
        citation="router-shift weighting after RSPO, Zhang et al. 2025 (arXiv 2510.23027), on the GRPO preset; "
        "gamma_min = 0.1 is moestab's choice, not a published value",
    ),
)

PRESETS: dict[str, AlgorithmPreset] = {preset.name: preset for preset in _PRESET_LIST}
"""Algorithm presets by name: grpo, gspo, gspo-token, dapo, dr-grpo, cispo, gmpo, rspo."""


def get_preset(name: str) -> AlgorithmPreset:
    """The preset of algorithm ``name``; ``UnknownNameError`` (lists valid names) otherwise."""
    return lookup(PRESETS, name, "algorithm preset")

"""The embedded policy's shape and the ``--model embedded:KEY=VALUE,...`` spec string (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmbeddedModelSpec:
    """Shape of the embedded policy."""

    family: str = "qwen3_moe"
    """Transformers MoE family (``moestab.models.families.TINY_CONFIGS``)."""
    num_layers: int = 4
    """Number of MoE decoder layers."""
    num_experts: int = 8
    """Routed experts per layer."""
    top_k: int = 2
    """Experts chosen per token."""
    hidden_size: int = 128
    """Residual width (a multiple of 4: four attention heads)."""
    seed: int = 0
    """Seed of the random initialisation."""


EMBEDDED = "embedded"
MODEL_SPEC_GRAMMAR = ("'embedded' or 'embedded:KEY=VALUE[,...]' with keys layers, experts, top_k, hidden, family, "
                      "e.g. 'embedded:layers=8,experts=32,top_k=4,hidden=256'")
_SPEC_KEYS = {"layers": "num_layers", "experts": "num_experts", "top_k": "top_k", "hidden": "hidden_size",
              "family": "family"}


def is_embedded(model: str) -> bool:
    """Whether a ``--model`` value names the embedded policy (``embedded`` or ``embedded:...``)."""
    return model == EMBEDDED or model.startswith(EMBEDDED + ":")


def parse_model_spec(model: str, seed: int = 0) -> EmbeddedModelSpec:
    """``embedded:layers=8,experts=32,top_k=4,hidden=256`` -> :class:`EmbeddedModelSpec` (unset keys: defaults).

    Raises ``ValueError`` naming what is wrong and what is valid.
    """
    from moestab.tasks.errors import TaskSpecError
    from moestab.tasks.spec import parse_spec

    try:
        name, params = parse_spec(model, "model", MODEL_SPEC_GRAMMAR)
    except TaskSpecError as exc:
        raise ValueError(str(exc)) from exc
    if name != EMBEDDED:
        raise ValueError(f"model spec {model!r}: only the embedded policy takes a spec; expected {MODEL_SPEC_GRAMMAR}")
    values: dict[str, object] = {"seed": seed}
    for key, raw in params.items():
        if key not in _SPEC_KEYS:
            raise ValueError(f"model spec {model!r}: unknown key {key!r}; valid: {', '.join(_SPEC_KEYS)}")
        if key == "family":
            from moestab.models.families import TINY_CONFIGS  # transformers: only when a family is named

            if raw not in TINY_CONFIGS:
                valid = ", ".join(sorted(TINY_CONFIGS))
                raise ValueError(f"model spec {model!r}: unknown family {raw!r}; valid: {valid}")
            values["family"] = raw
            continue
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"model spec {model!r}: {key}={raw!r} must be an integer >= 1")
        values[_SPEC_KEYS[key]] = int(raw)
    spec = EmbeddedModelSpec(**values)  # type: ignore[arg-type]
    if spec.top_k > spec.num_experts:
        raise ValueError(f"model spec {model!r}: top_k={spec.top_k} exceeds experts={spec.num_experts}")
    if spec.hidden_size % 4:
        raise ValueError(f"model spec {model!r}: hidden={spec.hidden_size} must be a multiple of 4 (four heads)")
    return spec

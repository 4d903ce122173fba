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
    expert_width: int | None = None
    """Hidden width of each routed expert's FFN; None: the family's tiny default (``hidden_size`` for qwen3_moe).
    Set only for the families in ``moestab.models.families.EXPERT_WIDTH_FIELDS``."""
    seed: int = 0
    """Seed of the random initialisation."""


EMBEDDED = "embedded"
MODEL_SPEC_GRAMMAR = ("'embedded', 'embedded:dense', 'embedded:fine' or 'embedded:KEY=VALUE[,...]' with keys layers, "
                      "experts, top_k, hidden, family, ffn, e.g. 'embedded:layers=8,experts=32,top_k=4,hidden=256'; a "
                      "named variant takes further keys it does not set, e.g. 'embedded:dense,layers=8'")
_SPEC_KEYS = {"layers": "num_layers", "experts": "num_experts", "top_k": "top_k", "hidden": "hidden_size",
              "family": "family", "ffn": "expert_width"}

# The named variants: each keeps the default's depth, residual width and active expert width per token
# (top_k * ffn = 2 * 128 = 256 in every MoE layer), and changes only how that width is split into experts.
EMBEDDED_VARIANTS: dict[str, str] = {
    "dense": "experts=1,top_k=1,ffn=256",
    # The dense control, spelled as a one-expert MoE: each layer's MLP is one FFN of width 256 behind a router whose
    # only choice is expert 0 with gate weight 1 (softmax over one logit), so the model computes a dense FFN, has no
    # routing to change (routing volatility 0 by construction) and keeps every moestab path (warm start, records,
    # replay modes, token tables) unchanged. The one-logit router's gradient is exactly 0: it never trains. Its
    # router has 128 weights per layer where the default's has 1,024 (the only parameters per token that differ).
    "fine": "experts=64,top_k=8,ffn=32",
    # Fine-grained experts, Qwen3-30B-A3B's style (128 experts, top-8, narrow experts): 64 experts of width 32, 8 per
    # token. Its routers have 64 logits, not 8: 7,168 more router parameters per layer than the default's.
}
"""``embedded:NAME`` shorthands for whole specs (docs/tasks.md, "Model variants: `--model embedded:...`")."""


def is_embedded(model: str) -> bool:
    """Whether a ``--model`` value names the embedded policy (``embedded`` or ``embedded:...``)."""
    return model == EMBEDDED or model.startswith(EMBEDDED + ":")


def parse_model_spec(model: str, seed: int = 0) -> EmbeddedModelSpec:
    """``embedded:layers=8,experts=32,top_k=4,hidden=256`` -> :class:`EmbeddedModelSpec` (unset keys: defaults);
    ``embedded:dense`` and ``embedded:fine`` stand for the specs in :data:`EMBEDDED_VARIANTS`, and may be followed
    by keys the variant does not set (``embedded:dense,layers=8``; a key the variant sets is "given twice").

    Raises ``ValueError`` naming what is wrong and what is valid.
    """
    from moestab.tasks.errors import TaskSpecError
    from moestab.tasks.spec import parse_spec

    try:
        name, params = parse_spec(_expand_variant(model), "model", MODEL_SPEC_GRAMMAR)
    except TaskSpecError as exc:
        raise ValueError(str(exc)) from exc
    if name != EMBEDDED:
        raise ValueError(f"model spec {model!r}: only the embedded policy takes a spec; expected {MODEL_SPEC_GRAMMAR}")
    values: dict[str, object] = {"seed": seed}
    for key, raw in params.items():
        values[_field(model, key)] = _value(model, key, raw)
    spec = EmbeddedModelSpec(**values)  # type: ignore[arg-type]
    _check_shape(model, spec)
    return spec


def _expand_variant(model: str) -> str:
    """``embedded:dense,layers=8`` -> ``embedded:experts=1,top_k=1,ffn=256,layers=8``; any other spec as it is."""
    head, _, rest = model.partition(":")
    variant, comma, more = rest.partition(",")
    if head.strip() != EMBEDDED or variant.strip() not in EMBEDDED_VARIANTS:
        return model
    return f"{EMBEDDED}:{EMBEDDED_VARIANTS[variant.strip()]}{comma}{more}"


def _field(model: str, key: str) -> str:
    """The :class:`EmbeddedModelSpec` field a spec key sets."""
    if key not in _SPEC_KEYS:
        raise ValueError(f"model spec {model!r}: unknown key {key!r}; valid: {', '.join(_SPEC_KEYS)}")
    return _SPEC_KEYS[key]


def _value(model: str, key: str, raw: str) -> str | int:
    """A spec value: a known family name, else an integer >= 1."""
    if key == "family":
        from moestab.models.families import TINY_CONFIGS  # transformers: only when a family is named

        if raw not in TINY_CONFIGS:
            raise ValueError(f"model spec {model!r}: unknown family {raw!r}; valid: {', '.join(sorted(TINY_CONFIGS))}")
        return raw
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"model spec {model!r}: {key}={raw!r} must be an integer >= 1")
    return int(raw)


MAX_EMBEDDED_PARAMS = 10**9
"""Largest embedded policy: 1e9 parameters take ~16 GB to train (fp32 weights, gradients and two AdamW moments);
a larger spec is a typo that would allocate for minutes and then fail, or hang (``layers=100000``)."""


def embedded_params(spec: EmbeddedModelSpec) -> int:
    """About how many parameters ``spec`` builds: per layer, attention (4 x hidden^2), the router (hidden x experts)
    and the experts (3 x hidden x width each); embeddings are left out (the vocabulary is a few hundred tokens)."""
    width = spec.expert_width or spec.hidden_size
    h = spec.hidden_size
    per_layer = 4 * h**2 + h * spec.num_experts + spec.num_experts * 3 * h * width
    return spec.num_layers * per_layer


def _check_shape(model: str, spec: EmbeddedModelSpec) -> None:
    """top_k within the experts, four heads, a size that fits in memory, and an expert width only where the family's
    config has one."""
    params = embedded_params(spec)
    if params > MAX_EMBEDDED_PARAMS:
        raise ValueError(f"model spec {model!r}: about {params:,} parameters ({params * 16 / 2**30:,.0f} GiB to "
                         f"train); the embedded policy takes at most {MAX_EMBEDDED_PARAMS:,}")
    if spec.top_k > spec.num_experts:
        raise ValueError(f"model spec {model!r}: top_k={spec.top_k} exceeds experts={spec.num_experts}")
    if spec.hidden_size % 4:
        raise ValueError(f"model spec {model!r}: hidden={spec.hidden_size} must be a multiple of 4 (four heads)")
    if spec.expert_width is not None:
        from moestab.models.families import EXPERT_WIDTH_FIELDS  # transformers: only when ffn is given

        if spec.family not in EXPERT_WIDTH_FIELDS:
            raise ValueError(f"model spec {model!r}: ffn is not supported for {spec.family}; valid families: "
                             f"{', '.join(EXPERT_WIDTH_FIELDS)}")

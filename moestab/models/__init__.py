"""Models moestab builds in code: the embedded default policy and tiny configs of each MoE family.

The names that need torch and transformers are imported on first use (PEP 562 ``__getattr__``), so
``moestab.models.spec``, which ``TrainConfig`` reads, imports neither: ``moestab train --help`` starts in a blink.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moestab.charset import CHARSET
from moestab.models.spec import EmbeddedModelSpec, is_embedded, parse_model_spec

if TYPE_CHECKING:
    from moestab.models.embedded import build_embedded_policy, save_policy, write_policy
    from moestab.models.families import TINY_CONFIGS, tiny_config
    from moestab.models.tokenizer import build_char_tokenizer

__all__ = [
    "CHARSET",
    "TINY_CONFIGS",
    "EmbeddedModelSpec",
    "build_char_tokenizer",
    "build_embedded_policy",
    "is_embedded",
    "parse_model_spec",
    "save_policy",
    "tiny_config",
    "write_policy",
]


def __getattr__(name: str) -> object:
    """The torch-backed names, imported when first asked for."""
    if name in ("build_embedded_policy", "save_policy", "write_policy"):
        from moestab.models import embedded

        return getattr(embedded, name)
    if name in ("TINY_CONFIGS", "tiny_config"):
        from moestab.models import families

        return getattr(families, name)
    if name == "build_char_tokenizer":
        from moestab.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

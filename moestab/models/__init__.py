"""Models moestab builds in code: the embedded default policy and tiny configs of each MoE family."""

from moestab.charset import CHARSET
from moestab.models.embedded import build_embedded_policy, save_policy, write_policy
from moestab.models.families import TINY_CONFIGS, tiny_config
from moestab.models.spec import EmbeddedModelSpec, is_embedded, parse_model_spec
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

"""Routes in from where MoE RL runs: each framework's route payload as moestab's ``Routes`` (docs/integrations.md).

    from moestab.routes_in import import_routes

    rollout = import_routes("vllm", request_outputs, num_experts=128)        # -> ImportedRoutes
    rollout.routes                  # Routes [batch, positions, layers, top_k], -1 where nothing was routed
    rollout.response_routes()       # [tokens, layers, top_k]: what moestab.recording.diagnostics compares

One small module per framework (``vllm``, ``sglang``, ``verl``, ``megatron`` for Megatron-Core and NeMo Automodel,
``prime_rl``, ``nemo_rl``, ``skyrl``, ``tunix`` for tunix and MaxText, ``slime``), each a function of the payload as
the framework holds it, and :data:`IMPORTERS`, the registry by name (:func:`importer` lists the valid names);
``wire`` decodes the base64 / dtype / shape payloads they share. A payload that does not fit its layout raises
:class:`PayloadError`, which names the field, its shape and dtype and what was expected, before anything is built.
Nothing here imports a framework: payloads are read by their documented field names, so objects and their JSON forms
both work.

``placement`` puts any engine's per-sequence rows on the trainer's layout: ``moestab train --rollout-engine vllm``
(``moestab.train.vllm_engine``) and every importer call it, which is why this package sits at layer 5, below both
the trainers and the integrations (docs/engineering.md, "The layers").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from moestab.routes_in.common import ImportedRoutes, PayloadError
from moestab.routes_in.megatron import from_megatron, from_nemo_automodel, to_megatron
from moestab.routes_in.nemo_rl import from_nemo_rl
from moestab.routes_in.prime_rl import from_prime_rl
from moestab.routes_in.sglang import from_sglang
from moestab.routes_in.skyrl import from_skyrl
from moestab.routes_in.slime import from_slime
from moestab.routes_in.tunix import from_maxtext, from_tunix
from moestab.routes_in.verl import from_verl
from moestab.routes_in.vllm import from_vllm

IMPORTERS: dict[str, Callable[..., ImportedRoutes]] = {
    "vllm": from_vllm,
    "sglang": from_sglang,
    "verl": from_verl,
    "megatron": from_megatron,
    "nemo-automodel": from_nemo_automodel,
    "prime-rl": from_prime_rl,
    "nemo-rl": from_nemo_rl,
    "skyrl": from_skyrl,
    "tunix": from_tunix,
    "maxtext": from_maxtext,
    "slime": from_slime,
}
"""Framework name -> its importer (``importer(payload, num_experts=..., **layout options)``)."""


def importer(name: str) -> Callable[..., ImportedRoutes]:
    """The importer registered as ``name``; ``ValueError`` listing the valid names otherwise."""
    try:
        return IMPORTERS[name]
    except KeyError:
        raise ValueError(f"no route importer named {name!r}; valid: {', '.join(IMPORTERS)}") from None


def import_routes(framework: str, payload: Any, **options: Any) -> ImportedRoutes:
    """``importer(framework)(payload, **options)``."""
    return importer(framework)(payload, **options)


__all__ = ["IMPORTERS", "ImportedRoutes", "PayloadError", "from_maxtext", "from_megatron", "from_nemo_automodel",
           "from_nemo_rl", "from_prime_rl", "from_sglang", "from_skyrl", "from_slime", "from_tunix", "from_verl",
           "from_vllm", "import_routes", "importer", "to_megatron"]

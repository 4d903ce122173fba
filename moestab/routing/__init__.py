"""Recording which experts tokens are routed to, and forcing recorded routes (Routing Replay).

Public API:

- ``RoutingRecorder(model, ...)``: context manager; ``.routes`` after exit.
- ``RoutingReplay(model, routes, force_gates=False)``: context manager forcing ``routes`` in every router
  (with ``force_gates``, their recorded gate weights too: "Total Router Recall"; with ``score_ratio``, prime-rl's
  score-threshold replay, ``moestab.routing.threshold``).
- ``Routes``: ``indices [batch, seq, layers, top_k]`` int16 (-1 at padding) plus optional stats and gates.
- ``router_parameters(model)``, ``freeze_routers(model)``: the routers' own parameters (``--freeze-router``).
- ``find_routers(model)``, ``SUPPORTED_FAMILIES``, ``ADAPTERS``: family support (docs/families.md); each router is
  checked against its adapter on the model itself (``moestab.routing.verify``).
- Errors: ``RoutingError``, ``NotAnMoEModelError`` (and its ``UnsupportedRoutingError``, ``RouterClassMissingError``,
  ``TransformersTooOldError``), ``AdapterMismatchError``, ``DamagedWeightsError``, ``IncompatibleTransformersError``,
  ``RoutesMismatchError``, ``RecordingError``.
"""

from moestab.routing.adapters import ADAPTERS, SUPPORTED_FAMILIES, RouterAdapter
from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import (
    AdapterMismatchError,
    DamagedWeightsError,
    IncompatibleTransformersError,
    NotAnMoEModelError,
    RecordingError,
    RouterClassMissingError,
    RoutesMismatchError,
    RoutingError,
    TransformersTooOldError,
    UnsupportedRoutingError,
)
from moestab.routing.freeze import freeze_routers, router_parameters
from moestab.routing.recorder import RoutingRecorder
from moestab.routing.replay import RoutingReplay
from moestab.routing.routes import Routes, gather_router_logprobs

__all__ = [
    "ADAPTERS",
    "SUPPORTED_FAMILIES",
    "AdapterMismatchError",
    "DamagedWeightsError",
    "IncompatibleTransformersError",
    "NotAnMoEModelError",
    "RecordingError",
    "RouterAdapter",
    "RouterClassMissingError",
    "RouterSite",
    "Routes",
    "RoutesMismatchError",
    "RoutingError",
    "RoutingRecorder",
    "RoutingReplay",
    "TransformersTooOldError",
    "UnsupportedRoutingError",
    "find_routers",
    "freeze_routers",
    "gather_router_logprobs",
    "router_parameters",
]

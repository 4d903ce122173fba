"""Recording which experts tokens are routed to, and forcing recorded routes (Routing Replay).

Public API:

- ``RoutingRecorder(model, ...)``: context manager; ``.routes`` after exit.
- ``RoutingReplay(model, routes, force_gates=False)``: context manager forcing ``routes`` in every router
  (with ``force_gates``, their recorded gate weights too: "Total Router Recall").
- ``Routes``: ``indices [batch, seq, layers, top_k]`` int16 (-1 at padding) plus optional stats and gates.
- ``find_routers(model)``, ``SUPPORTED_FAMILIES``, ``ADAPTERS``: family support.
- Errors: ``RoutingError``, ``NotAnMoEModelError``, ``RoutesMismatchError``, ``RecordingError``.
"""

from moestab.routing.adapters import ADAPTERS, SUPPORTED_FAMILIES, RouterAdapter
from moestab.routing.discovery import RouterSite, find_routers
from moestab.routing.errors import NotAnMoEModelError, RecordingError, RoutesMismatchError, RoutingError
from moestab.routing.recorder import RoutingRecorder
from moestab.routing.replay import RoutingReplay
from moestab.routing.routes import Routes, gather_router_logprobs

__all__ = [
    "ADAPTERS",
    "SUPPORTED_FAMILIES",
    "NotAnMoEModelError",
    "RecordingError",
    "RouterAdapter",
    "RouterSite",
    "Routes",
    "RoutesMismatchError",
    "RoutingError",
    "RoutingRecorder",
    "RoutingReplay",
    "find_routers",
    "gather_router_logprobs",
]

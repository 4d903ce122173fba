"""Typed errors of the routing package."""

from __future__ import annotations


class RoutingError(Exception):
    """Base class of every error raised by ``moestab.routing``."""


class NotAnMoEModelError(RoutingError, TypeError):
    """The model has no router of a supported MoE family."""


class RoutesMismatchError(RoutingError, ValueError):
    """Routes given to ``RoutingReplay`` do not fit the forward they are replayed into."""


class RecordingError(RoutingError, RuntimeError):
    """A forward could not be recorded (e.g. router called with an unexpected token count)."""


class IncompatibleTransformersError(RecordingError):
    """Recording under the installed transformers does not give one route per real position of the sequences asked
    for (``moestab.routing.compat``); the message names the version and what to install."""


class AdapterMismatchError(RoutingError, RuntimeError):
    """A family's adapter does not reproduce its router's own output (the family's math changed)."""


class DamagedWeightsError(RoutingError, ValueError):
    """A router's own weights hold NaN or infinity: the checkpoint is damaged (not a change of routing math)."""


class UnsupportedRoutingError(NotAnMoEModelError):
    """The model is an MoE whose routing cannot be forced exactly (hash routing, capacity dropping, ...)."""


class RouterClassMissingError(NotAnMoEModelError):
    """The model's family is supported, but this transformers build has no router class by the expected name."""


class TransformersTooOldError(NotAnMoEModelError):
    """The model's family is supported, but moestab's adapter matches its router only from a newer transformers
    release than the one installed (``RouterAdapter.min_transformers``); the message names both and what to install."""

"""Errors of the probes: bad input named with what is valid."""

from __future__ import annotations


class ProbeError(ValueError):
    """A probe's input is invalid (missing folder, dense model, mismatched architectures, bad suite)."""

"""Probes: routing questions answered on any MoE checkpoint, without a training loop.

- ``suites``: the texts a probe runs on (``general``, ``task:SPEC``, a JSONL file) with a manifest;
- ``checkpoints``: run folders or Hugging Face model folders, loaded in a dtype, dense models refused;
- ``collect``: routes, router margins and next-token log-probs of a model on a suite, in bounded memory;
- ``compare``: the routing / log-prob difference of two records of the same tokens;
- ``numerics``, ``saturation``: probes built on those; ``runner``: the probes by name;
- ``one_step``: one RL step from given weights, as ``moestab train``'s first step; ``step_volatility``, ``depth``:
  the step probes built on it (they take a task instead of a suite);
- ``folder``: the probe folder (``probe.json`` + CSV tables) the dashboard reads; ``plots``: its figures.

The checkout's top-level ``probes/`` holds the launchers: ``probes/NAME.py`` is ``moestab probe NAME`` (the same
command, for users who run scripts), ``probes/build_suites.py`` writes the suites above as files; the logic is here.

The names below are imported on first use (PEP 562 ``__getattr__``): ``moestab probe --help`` reads the registry
and :class:`ProbeSettings` without loading torch, transformers or pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moestab.probes.errors import ProbeError

if TYPE_CHECKING:
    from moestab.probes.folder import ProbeResult, read_probe_folder, write_probe_folder
    from moestab.probes.runner import PROBES, ProbeSettings, run_probe
    from moestab.probes.suites import ProbeSuite, load_suite

__all__ = ["PROBES", "ProbeError", "ProbeResult", "ProbeSettings", "ProbeSuite", "load_suite", "read_probe_folder",
           "run_probe", "write_probe_folder"]


def __getattr__(name: str) -> object:
    """The probes' names, each imported from its module when first asked for."""
    if name in ("ProbeResult", "read_probe_folder", "write_probe_folder"):
        from moestab.probes import folder

        return getattr(folder, name)
    if name in ("PROBES", "ProbeSettings", "run_probe"):
        from moestab.probes import runner

        return getattr(runner, name)
    if name in ("ProbeSuite", "load_suite"):
        from moestab.probes import suites

        return getattr(suites, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Probes: routing questions answered on any MoE checkpoint, without a training loop.

- ``suites``: the texts a probe runs on (``general``, ``task:SPEC``, a JSONL file) with a manifest;
- ``checkpoints``: run folders or Hugging Face model folders, loaded in a dtype, dense models refused;
- ``collect``: routes, router margins and next-token log-probs of a model on a suite, in bounded memory;
- ``compare``: the routing / log-prob difference of two records of the same tokens;
- ``numerics``, ``saturation``: probes built on those; ``runner``: the probes by name;
- ``one_step``: one RL step from given weights, as ``moestab train``'s first step; ``step_volatility``, ``depth``:
  the step probes built on it (they take a task instead of a suite);
- ``folder``: the probe folder (``probe.json`` + CSV tables) the dashboard reads; ``plots``: its figures.
"""

from moestab.probes.errors import ProbeError
from moestab.probes.folder import ProbeResult, read_probe_folder, write_probe_folder
from moestab.probes.runner import PROBES, ProbeSettings, run_probe
from moestab.probes.suites import ProbeSuite, load_suite

__all__ = ["PROBES", "ProbeError", "ProbeResult", "ProbeSettings", "ProbeSuite", "load_suite", "read_probe_folder",
           "run_probe", "write_probe_folder"]

"""What each optional extra of pyproject.toml adds, and the one error a command gives when it is missing.

``pip install moestab`` is the core a trainer's environment needs (recording, replay, records, metrics, analysis,
the route importers and diagnostics, the verl recipe, the TRL integration's code): torch, transformers, pandas,
pyarrow, pyyaml and tqdm. Everything that only a person at a screen needs is an extra, so that moestab does not pull
Streamlit's or matplotlib's dependency trees into a framework's pinned environment. A command that needs an extra
asks :func:`require` before it does anything else, and is refused with the ``pip install`` line that fixes it.

``EXTRAS`` names the modules each extra makes importable; tests/test_project.py holds it to pyproject's extras.
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "plots": ("matplotlib",),  # moestab analyze --plots, moestab probe --plots
    "dashboard": ("streamlit",),  # moestab dashboard
    "notebooks": ("matplotlib", "jupytext", "nbclient", "ipykernel", "nbformat"),  # scripts/run_notebooks.py
    "trl": ("trl",),  # moestab.integrations.trl
    "vllm": ("vllm",),  # moestab train --rollout-engine vllm
    "tensorboard": ("tensorboard",),  # --report-to tensorboard
    "wandb": ("wandb",),  # --report-to wandb
    "trackio": ("trackio",),  # --report-to trackio
}
"""Extra -> the top-level modules it installs (each module's distribution has the same name)."""


class MissingExtraError(ImportError):
    """A command or module needs an optional extra that is not installed; the message says what to install."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them: cheap)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; valid: {', '.join(EXTRAS)}")
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def install_line(extra: str) -> str:
    return f"pip install 'moestab[{extra}]'"


def require(extra: str, needed_by: str) -> None:
    """Raise :class:`MissingExtraError` naming ``needed_by``, the missing modules and the install line, unless every
    module of ``extra`` is importable."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{needed_by} needs {', '.join(missing)}, which `pip install moestab` leaves out: {install_line(extra)} "
            "(scripts/setup.sh installs the dashboard, plots and notebooks extras in a source checkout)"
        )

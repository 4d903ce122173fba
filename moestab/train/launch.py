"""``moestab train --nproc N``: the N training processes, started with torchrun on this machine.

The launcher checks what it can first (the config, the run folder), so a refusal is said once, before any process
starts; the processes then get the resolved config as a YAML file, so they run exactly what was checked.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from moestab.configs import config_to_dict
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.errors import RunError
from moestab.train.config import TrainConfig
from moestab.train.interrupt import exit_status
from moestab.train.run_lifetime import prepare_run_folder

logger = logging.getLogger(__name__)
"""The launcher's notes when :func:`launch` is given no ``log``."""

FORWARDED = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_TIMEOUT_S = 3600
"""How long torchrun waits, after forwarding Ctrl-C / SIGTERM, for the processes to finish their step and save
(its default, 30 s, kills them mid-step on any real model)."""


def torchrun_command(config_file: Path, nproc: int) -> list[str]:
    """The command that starts ``nproc`` processes of ``moestab train --config config_file`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}", "-m", "moestab", "train", "--config", str(config_file)]


def worker_environment(config: TrainConfig) -> dict[str, str]:
    """The processes' environment: torch's CPU threads shared out between them (torchrun would set 1 each)."""
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(config.threads or max(1, (os.cpu_count() or 1) // config.nproc))
    return env


def launch(config: TrainConfig, *, log: Callable[[str], None] = logger.info) -> tuple[int, bool]:
    """Run ``config`` in ``config.nproc`` processes; returns ``(exit status, whether the run ended cleanly)``: 0 when
    it finished, 130 / 143 (:func:`~moestab.train.interrupt.exit_status`) when a forwarded Ctrl-C / SIGTERM stopped it
    cleanly (torchrun exits non-zero after forwarding a signal, even when rank 0 saved), else torchrun's status.

    Ctrl-C and SIGTERM reach the processes once, through torchrun (its own session, so a terminal's Ctrl-C is not
    delivered twice): each finishes its step, rank 0 saves and marks the run ``interrupted``. When a process dies,
    torchrun stops the others and names the rank that failed first; rank 0 records the failure in run.json when it
    can. ``log`` takes the run folder's notes (an overwrite, a lock taken over; ``moestab train`` prints them).
    """
    prepare_run_folder(config, log=log)  # raises before any process starts
    signalled: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        child.send_signal(signum)

    with tempfile.TemporaryDirectory(prefix="moestab-launch-") as tmp:
        config_file = Path(tmp) / "config.yaml"
        config_file.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
        started = time.time()
        child = subprocess.Popen(torchrun_command(config_file, config.nproc), start_new_session=True,
                                 env=worker_environment(config))
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code == 0:
        return 0, True
    status = _clean_end_since(Path(config.run_dir), started) if signalled else None
    if status is not None:
        return exit_status(status, signalled[0]), True
    return code, False


def _clean_end_since(run_dir: Path, started: float) -> str | None:
    """``interrupted`` or ``finished`` when this launch's run left run.json so (a run.json from before does not
    count), else ``None``."""
    folder = RunFolder(run_dir)
    try:
        status = folder.info().status if folder.run_json.stat().st_mtime >= started else None
    except (OSError, RunError):
        return None
    return status if status in (schema.STATUS_FINISHED, schema.STATUS_INTERRUPTED) else None

"""``moestab train --nproc N``: the N training processes, started with torchrun on this machine.

The launcher checks what it can first (the config, the run folder), so a refusal is said once, before any process
starts; the processes then get the resolved config as a YAML file, so they run exactly what was checked.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from moestab.configs import config_to_dict
from moestab.records import schema
from moestab.records.errors import RunError
from moestab.records.run_info import read_run_info
from moestab.train.config import TrainConfig
from moestab.train.loop import prepare_run_folder

FORWARDED = (signal.SIGINT, signal.SIGTERM)


def torchrun_command(config_file: Path, nproc: int) -> list[str]:
    """The command that starts ``nproc`` processes of ``moestab train --config config_file`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "moestab", "train", "--config", str(config_file)]


def launch(config: TrainConfig) -> int:
    """Run ``config`` in ``config.nproc`` processes; returns 0 when the run finished or was interrupted (and saved),
    else torchrun's exit status.

    Ctrl-C and SIGTERM reach the processes once, through torchrun (its own session, so a terminal's Ctrl-C is not
    delivered twice): each finishes its step, rank 0 saves and marks the run ``interrupted``. When a process dies,
    torchrun stops the others and names the rank that failed first; rank 0 records the failure in run.json when it
    can.
    """
    prepare_run_folder(config, log=lambda _: None)  # raises before any process starts
    with tempfile.TemporaryDirectory(prefix="moestab-launch-") as tmp:
        config_file = Path(tmp) / "config.yaml"
        config_file.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
        child = subprocess.Popen(torchrun_command(config_file, config.nproc), start_new_session=True)
        previous = {sig: signal.signal(sig, lambda signum, _: child.send_signal(signum)) for sig in FORWARDED}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    try:  # torchrun exits non-zero after forwarding a signal, even when the run was saved
        stopped_cleanly = read_run_info(config.run_dir).status in (schema.STATUS_FINISHED, schema.STATUS_INTERRUPTED)
    except RunError:
        stopped_cleanly = False
    return 0 if stopped_cleanly else code or 1

"""Processes that trained a sharded model exit cleanly.

With torch 2.13, FSDP2 over gloo leaves reference cycles holding gloo work objects; when they are left to interpreter
finalization the process aborts ("terminate called without an active exception", SIGABRT) in about 1 exit in 4
(8 of 30 two-process runs of this worker without the collection in ``process_group``; 0 of 30 with it). This is what
made a finished ``moestab train --nproc 2`` report failure now and then. Eight sessions in a row all exit 0 only by
chance (about 0.75**8 = 10%) when the collection is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("pg_exit_worker.py")
SESSIONS = 8


@pytest.mark.slow
def test_sharded_processes_exit_zero_every_time():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(WORKER)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for session in range(SESSIONS):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)
        assert done.returncode == 0, f"session {session}: exit {done.returncode}\n{done.stderr[-3000:]}"
        assert "terminate called" not in done.stderr

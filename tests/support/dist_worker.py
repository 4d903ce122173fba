"""One training process of the multi-process tests: ``torchrun ... dist_worker.py CONFIG_JSON ENGINE [MEASUREMENT]``.

Runs ``moestab.train.train`` with a test rollout engine (tests/support/distributed_engines.py), which the command
line cannot choose, and with measurement ``MEASUREMENT`` of tests/support/measurements.py added when named, then
exits 3 if any FSDP module outlived the run (tests/train/test_process_group_exit.py).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package

from moestab.configs import build_config
from moestab.recording import measurements
from moestab.train import TrainConfig, train
from tests.support.distributed_engines import ENGINES
from tests.support.measurements import add
from tests.support.pg_exit_worker import exit_if_sharded_alive

if __name__ == "__main__":
    config = build_config(TrainConfig, json.loads(sys.argv[1]))
    if len(sys.argv) > 3:  # this process's own list: a test's monkeypatch does not reach it
        measurements.MEASUREMENTS = add(sys.argv[3])
    train(config, rollout_engine=ENGINES[sys.argv[2]])
    exit_if_sharded_alive()  # a finished run leaves nothing sharded to interpreter finalization

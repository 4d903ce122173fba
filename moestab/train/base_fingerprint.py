"""Which base a run routes by: a fingerprint of the warm-started base's files, recorded in run.json and checked on
``--resume``. A base-routed run (``--routing-replay base``, the routing-constant control) or one measuring its
distance to the base (``--measure-base-routes``) compares the policy with that model at every step: a base changed
between a run's start and its resume (a cache entry rebuilt or edited) would change the control mid-run without a
word (issue 55.3)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from moestab.run_folder import schema
from moestab.train.config import TrainConfig
from moestab.train.run_lifetime import TrainingError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json")
"""The base folder's files that decide its forward: weights, their index and the model's config."""


def uses_base(config: TrainConfig) -> bool:
    """Whether the run compares the policy with the warm-started base at every step."""
    return config.routing_replay in schema.BASE_ROUTED_MODES or config.measure_base_routes


def fingerprint(folder: str | Path) -> str:
    """sha256 of the names and bytes of ``folder``'s weight and config files (:data:`WEIGHT_SUFFIXES`), in name
    order, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES
                   and not p.name.startswith("tokenizer"))
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while piece := f.read(1 << 20):
                digest.update(piece)
    return digest.hexdigest()


def check_resumed_base(recorded: dict | None, base_path: str, config: TrainConfig) -> None:
    """:class:`TrainingError` when a run that uses its base resumes on a base whose fingerprint is not the one its
    run.json recorded (``recorded``: run.json's ``warm_start``); a run started before fingerprints were recorded
    resumes unchecked."""
    if not uses_base(config) or not recorded or "fingerprint" not in recorded:
        return
    now = fingerprint(base_path)
    if now != recorded["fingerprint"]:
        setting = (f"--routing-replay {config.routing_replay}" if config.routing_replay in schema.BASE_ROUTED_MODES
                   else "--measure-base-routes")
        raise TrainingError(
            f"--resume: the warm-started base at {base_path} is not the one this run started from (fingerprint "
            f"{now[:12]}, run.json records {recorded['fingerprint'][:12]}): under {setting} the run would compare "
            "the policy with another model from this step on. Restore that base (rebuild it with the run's "
            "settings, or copy it back), or start a new run")

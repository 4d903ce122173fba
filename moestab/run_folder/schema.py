"""Names in a run folder, shared by the writer (``moestab.train``) and the readers (``moestab.analysis``).

The full description, with units and meaning, is docs/run-format.md (files and columns) and
docs/metrics.md (metric keys); bump ``SCHEMA_VERSION`` on any change that an older reader would
misread.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 4
"""Version 4: the per-token tables' route columns store what changed: each is ``FixedSizeBinary`` as in version 3, and
all but the first may hold the bytewise XOR of their ids with a reference column's, zstd-compressed; the references
are in the table's schema metadata :data:`ROUTES_METADATA_KEY` (:mod:`moestab.run_folder.route_columns`). Version 3
(route columns ``FixedSizeBinary`` of uint8 or int16 ids, plain and uncompressed, their layout in the same metadata;
~10x faster to decode than version 2's ``FixedSizeList<int16>``) and version 2 (pi_old recorded on both sides:
``*_old`` = as used in the ratio, ``*_old_free`` = the trainer's free routing; metric keys name the pair of quantities
they compare) are still read: readers decode each table by its own column types and metadata. Version 1 runs are
refused with an error (their ``routes_old`` and ``mismatch/*`` meant something else under R3)."""
OLDEST_READ_VERSION = 2
"""The oldest ``schema_version`` this moestab reads; a writer that continues such a run (``--resume``) marks it
:data:`SCHEMA_VERSION`, since the tables it adds have the current layout."""

# Files and folders inside a run folder.
RUN_JSON = "run.json"  # status, resolved config, model description, summary
CONFIG_YAML = "config.yaml"  # resolved config, re-loadable with `moestab train --config`
METRICS_JSONL = "metrics.jsonl"  # one JSON object per training step
TOKENS_DIR = "tokens"  # per-token Parquet tables, one file per step
CHECKPOINTS_DIR = "checkpoints"  # Hugging Face folders step_XXXXXX/
STATE_DIR = "state"  # optimizer / RNG state for --resume
TENSORBOARD_DIR = "tensorboard"  # event files of --report-to tensorboard (W&B writes wandb/ beside it)
LOCK_FILE = ".moestab.lock"  # held by the process writing the run (run_folder/lock.py); absent when none is
WANDB_DIR = "wandb"  # W&B's files of --report-to wandb
TRACKER_FOLDERS = {"tensorboard": TENSORBOARD_DIR, "wandb": WANDB_DIR}
"""Trackers (``--report-to``) that write a folder of their own inside the run, and its name."""
RUN_CONTENTS = (RUN_JSON, CONFIG_YAML, METRICS_JSONL, TOKENS_DIR, CHECKPOINTS_DIR, STATE_DIR, TENSORBOARD_DIR,
                WANDB_DIR)
"""What a run writes in its folder besides the lock and temporaries: all that --overwrite deletes (a user's notes or
analyses kept beside them stay)."""

# run.json "status" values.
STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"
STATUSES = (STATUS_RUNNING, STATUS_FINISHED, STATUS_FAILED, STATUS_INTERRUPTED)
# Never written: what readers report for a "running" run whose writer died (SIGKILL, power loss).
STATUS_STOPPED = "stopped"
# Never written: what readers report for a run whose metrics.jsonl steps repeat or go back (two writers mixed it).
STATUS_DAMAGED = "damaged"

# Routing Replay modes (config ``routing_replay``) and the papers' names for them.
REPLAY_MODES = ("off", "old", "rollout", "rollout-gates", "base")
REPLAY_LABELS = {"off": "off", "old": "R2", "rollout": "R3", "rollout-gates": "TRR", "base": "constant"}
"""off: free routing everywhere; old = R2: the updates replay pi_old's trainer routes; rollout = R3:
pi_old and the updates replay the rollout engine's routes; rollout-gates = TRR (prime-rl's "Total Router
Recall"): as R3, with the rollout engine's gate weights as given too, the router frozen in those forwards;
base = routing-constant (the control of issue 41): every forward of the policy, generation and evaluation included,
uses the experts the frozen warm-started base chooses for the same tokens (``moestab.routing.base_routing``), so
routing never changes; the rollout engine's routes are then the base's, replayed by pi_old and the updates as R3."""
REPLAY_ROUTES: dict[str, str | None] = {"off": None, "old": "old", "rollout": "rollout", "rollout-gates": "rollout",
                                        "base": "rollout"}
"""Per mode, whose routes the ratio's pi_old and the updates use: the trainer's under pi_old (``old``), the rollout
engine's (``rollout``) or none (free routing). Anything about routes treats TRR, and the routing-constant arm (whose
rollout routes are the base's), as R3."""
BASE_ROUTED_MODES = ("base",)
"""Modes whose policy routes as the frozen base in every forward: generation and evaluation too."""
INTEGRITY_POLICIES = ("warn", "refuse")
"""What a trainer does with a route capture that fails an integrity check (config ``route_integrity``,
``moestab.metrics.integrity``): ``warn`` (log it, keep training) or ``refuse`` (stop before its routes are
replayed)."""
COLLAPSE_POLICIES = ("log", "stop")
"""What a collapse warning does (config ``on_collapse_warning``, docs/collapse.md): ``log`` it and keep it in run.json's
``warnings``, or also ``stop`` the run after the step."""
GATE_REPLAY_MODES = ("rollout-gates",)
"""Modes that replay recorded gate weights too (their rollout engine records them)."""

_STEP_NAME = re.compile(r"^step_(\d{6,})$")
_TOKENS_NAME = re.compile(r"^step_(\d{6,})\.parquet$")


def step_name(step: int) -> str:
    """``step_000012``: the name of a step's checkpoint folder and optimizer state (plus suffix)."""
    return f"step_{step:06d}"


def parse_step_name(name: str) -> int | None:
    """The step of a checkpoint folder name ``step_XXXXXX``, or ``None`` for any other name."""
    match = _STEP_NAME.match(name)
    return int(match.group(1)) if match else None


def parse_tokens_name(name: str) -> int | None:
    """The step of a per-token table name ``step_XXXXXX.parquet``, or ``None`` for any other name."""
    match = _TOKENS_NAME.match(name)
    return int(match.group(1)) if match else None


def tokens_file(step: int) -> str:
    """Relative path of the per-token table of ``step``."""
    return f"{TOKENS_DIR}/{step_name(step)}.parquet"


def checkpoint_dir(step: int) -> str:
    """Relative path of the checkpoint written after ``step``."""
    return f"{CHECKPOINTS_DIR}/{step_name(step)}"


def state_file(step: int) -> str:
    """Relative path of the optimizer state written with the checkpoint of ``step``."""
    return f"{STATE_DIR}/{step_name(step)}.pt"


# Per-token table columns (one row per response token of a recorded sequence).
COL_STEP = "step"  # int32, 1-based training step
COL_SEQ = "seq"  # int32, sequence index within the step's rollout batch
COL_PROMPT = "prompt"  # int32, prompt (group) index within the step
COL_MINIBATCH = "minibatch"  # int16, index of the minibatch in which the sequence was updated
COL_POSITION = "position"  # int32, 0-based position of the token within its response
COL_RESPONSE_LEN = "response_length"  # int32, number of loss tokens of the response
COL_REWARD = "reward"  # float32, sequence reward
COL_ADVANTAGE = "advantage"  # float32, sequence (or token) advantage used in the loss
COL_LOGP_ROLLOUT = "logp_rollout"  # float32, log-prob under the rollout engine (sampling distribution)
COL_LOGP_OLD = "logp_old"  # float32, log-prob under pi_old as used in the ratio (replayed routes under R3 / TRR)
COL_LOGP_OLD_FREE = "logp_old_free"  # float32, log-prob under pi_old with the trainer's free routing
COL_LOGP_UPDATE = "logp_update"  # float32, log-prob under the current policy at its minibatch update
COL_LOGP_NEW = "logp_new"  # float32, log-prob after all updates of the step, free routing
COL_LOG_W = "log_w"  # float32, logp_update - logp_old: the token log-ratio that entered the loss
COL_CLIPPED = "clipped"  # bool, the token's ratio (or its sequence ratio, for sequence-level losses) was clipped

# Route columns: layers * top_k expert ids a row, row-major [layer, slot]. Versions 3 and 4: FixedSizeBinary of
# little-endian uint8 (<= 255 experts; 255 = not recorded) or int16 (-1 = not recorded) ids, described by the table's
# schema metadata ROUTES_METADATA_KEY (version 4: a column may hold its ids XOR a reference column's); version 2:
# FixedSizeList<int16>, -1 = not recorded. Readers return int16, -1.
COL_ROUTES_ROLLOUT = "routes_rollout"  # experts chosen by the rollout engine
COL_ROUTES_OLD = "routes_old"  # routes that produced logp_old (= routes_rollout under R3 / TRR)
COL_ROUTES_OLD_FREE = "routes_old_free"  # trainer's free routes under pi_old
COL_ROUTES_UPDATE = "routes_update"  # routes that produced logp_update (replayed under R2/R3/TRR)
COL_ROUTES_NEW = "routes_new"  # trainer's free routes after all updates of the step
ROUTE_COLUMNS = (COL_ROUTES_ROLLOUT, COL_ROUTES_OLD, COL_ROUTES_OLD_FREE, COL_ROUTES_UPDATE, COL_ROUTES_NEW)
ROUTES_METADATA_KEY = "moestab.routes"  # schema metadata key: JSON layout of the binary route columns (versions 3, 4)
# FixedSizeList<float32>[layers]: gap between the k-th and (k+1)-th router score under pi_old (free routing).
COL_MARGIN_OLD = "margin_old"
# FixedSizeList<float32>[layers]: routing confidence under pi_old (free): softmax(router logits) mass on the chosen.
COL_CONFIDENCE_OLD = "confidence_old"

ROUTE_PAIRS: dict[str, tuple[str, str]] = {
    "old_new": (COL_ROUTES_OLD_FREE, COL_ROUTES_NEW),
    "update_old": (COL_ROUTES_UPDATE, COL_ROUTES_OLD),
    "rollout_old": (COL_ROUTES_ROLLOUT, COL_ROUTES_OLD),
    "rollout_old_free": (COL_ROUTES_ROLLOUT, COL_ROUTES_OLD_FREE),
    "rollout_new": (COL_ROUTES_ROLLOUT, COL_ROUTES_NEW),
}
"""Route-column pairs by the name used in metric keys (``routing/<pair>/...``) and by the analyzers:

- ``old_new``: pi_old -> pi_new, both free: routing volatility of the step's updates (GSPO §5.3);
- ``update_old``: the two sides of ``log w`` (routes of ``logp_update`` vs ``logp_old``);
- ``rollout_old``: rollout engine vs pi_old *as used in the ratio* (0 under R3 and TRR: what the loss sees);
- ``rollout_old_free``: rollout engine vs the trainer's *free* pi_old (the gap routing creates);
- ``rollout_new``: rollout engine vs pi_new (free).
"""

LOGP_PAIRS: dict[str, tuple[str, str]] = {
    "rollout_old": (COL_LOGP_ROLLOUT, COL_LOGP_OLD),
    "rollout_old_free": (COL_LOGP_ROLLOUT, COL_LOGP_OLD_FREE),
}
"""Log-prob pairs of the rollout->trainer mismatch (``mismatch/<pair>/...``), named like :data:`ROUTE_PAIRS`:
``(sampling distribution, trainer)``."""

"""Names in a run folder, shared by the writer (``moestab.train``) and the readers (``moestab.analysis``).

The full description, with units and meaning, is docs/run-format.md; bump ``SCHEMA_VERSION`` on any
change that an older reader would misread.
"""

SCHEMA_VERSION = 1

# Files and folders inside a run folder.
RUN_JSON = "run.json"  # status, resolved config, model description, summary
CONFIG_YAML = "config.yaml"  # resolved config, re-loadable with `moestab train --config`
METRICS_JSONL = "metrics.jsonl"  # one JSON object per training step
TOKENS_DIR = "tokens"  # per-token Parquet tables, one file per step
CHECKPOINTS_DIR = "checkpoints"  # Hugging Face folders step_XXXXXX/
STATE_DIR = "state"  # optimizer / RNG state for --resume

# run.json "status" values.
STATUS_RUNNING = "running"
STATUS_FINISHED = "finished"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"
STATUSES = (STATUS_RUNNING, STATUS_FINISHED, STATUS_FAILED, STATUS_INTERRUPTED)


def tokens_file(step: int) -> str:
    """Relative path of the per-token table of ``step``."""
    return f"{TOKENS_DIR}/step_{step:06d}.parquet"


def checkpoint_dir(step: int) -> str:
    """Relative path of the checkpoint written after ``step``."""
    return f"{CHECKPOINTS_DIR}/step_{step:06d}"


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
COL_LOGP_OLD = "logp_old"  # float32, log-prob under pi_old as used in the ratio (replayed under R3)
COL_LOGP_UPDATE = "logp_update"  # float32, log-prob under the current policy at its minibatch update
COL_LOGP_NEW = "logp_new"  # float32, log-prob after all updates of the step, free routing
COL_LOG_W = "log_w"  # float32, logp_update - logp_old: the token log-ratio that entered the loss
COL_CLIPPED = "clipped"  # bool, the token's ratio (or its sequence ratio, for sequence-level losses) was clipped

# Route columns: FixedSizeList<int16>[layers * top_k], row-major [layer, slot], -1 where not recorded.
COL_ROUTES_ROLLOUT = "routes_rollout"  # experts chosen by the rollout engine
COL_ROUTES_OLD = "routes_old"  # trainer's free routes under pi_old
COL_ROUTES_UPDATE = "routes_update"  # routes used in the update forward (replayed under R2/R3)
COL_ROUTES_NEW = "routes_new"  # trainer's free routes after all updates of the step
ROUTE_COLUMNS = (COL_ROUTES_ROLLOUT, COL_ROUTES_OLD, COL_ROUTES_UPDATE, COL_ROUTES_NEW)
# FixedSizeList<float32>[layers]: gap between the k-th and (k+1)-th router score under pi_old.
COL_MARGIN_OLD = "margin_old"

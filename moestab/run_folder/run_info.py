"""``RunInfo``: run.json as a typed object, read and written only here (docs/run-format.md, "run.json")."""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moestab import __version__
from moestab.run_folder import schema
from moestab.run_folder.errors import NotARunError, RunFileError, SchemaVersionError


def now() -> str:
    """The current UTC time as ISO-8601 (seconds), the format of ``created`` / ``updated``."""
    return datetime.now(UTC).isoformat(timespec="seconds")


STALE_AFTER_S = 600.0
"""A ``running`` run whose writer is on another host and has not beaten for this long is ``stopped``."""


def this_writer() -> dict[str, Any]:
    """run.json ``writer`` of the current process: host, PID and a fresh heartbeat."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": now()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def json_safe(value: Any) -> Any:
    """NaN / inf -> None (JSON has no NaN), recursively; tuples -> lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelInfo:
    """run.json ``model``: the policy's MoE layout and which layers the per-token tables hold."""

    family: str
    """transformers ``model_type``."""
    moe_layers: tuple[int, ...]
    """Decoder-layer indices of the MoE layers."""
    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts chosen per token and layer."""
    recorded_layers: tuple[int, ...]
    """Decoder-layer indices of the MoE layers in the route columns, in column order (a subset of ``moe_layers``)."""

    @property
    def num_layers(self) -> int:
        """Number of MoE layers."""
        return len(self.moe_layers)


@dataclass(frozen=True)
class RunInfo:
    """Everything run.json holds. Read with :func:`read_run_info`, written by ``RunWriter``."""

    config: dict[str, Any]
    """The resolved training config: every field of ``moestab.train.TrainConfig``, defaults included."""
    model: ModelInfo
    status: str = schema.STATUS_RUNNING
    """``running``, ``finished``, ``failed`` (see ``error``) or ``interrupted``."""
    created: str = ""
    updated: str = ""
    last_step: int = 0
    """Last completed step."""
    warm_start: dict[str, Any] | None = None
    """``accuracy`` of the starting policy on the eval set, ``path`` of the base, ``record`` of its warm start."""
    final_accuracy: float | None = None
    """Eval accuracy after training (finished runs); run.json ``final.accuracy``."""
    error: str | None = None
    """Message of a failed or interrupted run."""
    warnings: tuple[str, ...] = ()
    """What the writer noticed while the run went on that makes its numbers read oddly (e.g. a TRL run whose policy
    never changed, so its old->new volatility is 0 for that reason), each once; run.json omits the key when empty."""
    environment: dict[str, Any] = field(default_factory=dict)
    """What the numbers may depend on besides the config: ``torch_threads``, ``torch``, ``transformers``."""
    writer: dict[str, Any] = field(default_factory=dict)
    """The process writing the run: ``host``, ``pid`` and ``heartbeat`` (ISO time, renewed while it runs)."""
    moestab_version: str = __version__
    schema_version: int = schema.SCHEMA_VERSION
    path: Path | None = field(default=None, compare=False)
    """The run folder it was read from (not stored)."""

    # ---- derived views --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The run folder's name."""
        return "" if self.path is None else self.path.resolve().name

    @property
    def algo(self) -> str:
        return str(self.config["algo"])

    @property
    def replay(self) -> str:
        """Routing Replay mode as configured: ``off``, ``old``, ``rollout``, ``rollout-gates`` or ``base``."""
        return str(self.config["routing_replay"])

    @property
    def replay_label(self) -> str:
        """The papers' name of the replay mode: ``off``, ``R2``, ``R3`` or ``TRR`` (``constant``: the base's routes)."""
        return schema.REPLAY_LABELS[self.replay]

    @property
    def model_name(self) -> str:
        return str(self.config["model"])

    @property
    def task(self) -> str:
        """The task spec the run trained on (``config.task``)."""
        return str(self.config["task"])

    @property
    def top_k(self) -> int:
        return self.model.top_k

    @property
    def num_experts(self) -> int:
        return self.model.num_experts

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def recorded_layers(self) -> tuple[int, ...]:
        return self.model.recorded_layers

    @property
    def planned_steps(self) -> int:
        return int(self.config["steps"])

    def live_status(self, *, at: datetime | None = None) -> str:
        """``status``, except that a ``running`` run whose writer is gone is ``stopped`` (resumable).

        After a SIGKILL or a power loss nothing can write the status, so it is judged here: on the
        writer's host, by whether its PID is alive; elsewhere, by a heartbeat older than
        :data:`STALE_AFTER_S`.
        """
        if self.status != schema.STATUS_RUNNING:
            return self.status
        host, pid, beat = self.writer.get("host"), self.writer.get("pid"), self.writer.get("heartbeat")
        if host == socket.gethostname() and isinstance(pid, int):
            return schema.STATUS_RUNNING if _pid_alive(pid) else schema.STATUS_STOPPED
        try:
            age = ((at or datetime.now(UTC)) - datetime.fromisoformat(str(beat))).total_seconds()
        except ValueError:
            return schema.STATUS_STOPPED  # no heartbeat at all: nothing vouches for a live writer
        return schema.STATUS_STOPPED if age > STALE_AFTER_S else schema.STATUS_RUNNING

    @property
    def warm_start_accuracy(self) -> float | None:
        value = (self.warm_start or {}).get("accuracy")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    # ---- JSON -----------------------------------------------------------------------------------
    def updated_with(self, **fields: Any) -> RunInfo:
        """A copy with ``fields`` changed and ``updated`` set to now."""
        return replace(self, **fields, updated=now())

    def to_json(self) -> dict[str, Any]:
        """The run.json object (docs/run-format.md)."""
        out: dict[str, Any] = {
            "schema_version": self.schema_version,
            "moestab_version": self.moestab_version,
            "status": self.status,
            "created": self.created,
            "updated": self.updated,
            "config": self.config,
            "model": {**asdict(self.model), "num_layers": self.model.num_layers},
            "environment": self.environment,
            "writer": self.writer,
            "last_step": self.last_step,
        }
        if self.warm_start is not None:
            out["warm_start"] = self.warm_start
        if self.final_accuracy is not None:
            out["final"] = {"accuracy": self.final_accuracy}
        if self.error is not None:
            out["error"] = self.error
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return json_safe(out)

    @classmethod
    def from_json(cls, raw: Any, source: Path) -> RunInfo:
        """Parse a run.json object read from ``source`` (run.json's path); :class:`RunFileError` names what is wrong."""
        if not isinstance(raw, dict):
            raise RunFileError(source, "not a JSON object")
        version = raw.get("schema_version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise RunFileError(source, f"schema_version missing or not an integer (got {version!r})")
        if version > schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{source}: schema_version {version} is newer than this moestab reads "
                f"({schema.SCHEMA_VERSION}); upgrade moestab to analyse this run"
            )
        if version < schema.OLDEST_READ_VERSION:
            raise SchemaVersionError(
                f"{source}: schema_version {version} was written by an older moestab whose pi_old columns and "
                f"mismatch keys meant different things under R3; it cannot be upgraded (the free pi_old was not "
                f"recorded). Re-run it with this moestab ({raw.get('moestab_version', '?')} -> {__version__})"
            )
        try:
            model = raw["model"]
            info = cls(
                config=dict(raw["config"]),
                model=ModelInfo(
                    family=str(model["family"]),
                    moe_layers=tuple(_ints(model["moe_layers"])),
                    num_experts=int(model["num_experts"]),
                    top_k=int(model["top_k"]),
                    recorded_layers=tuple(_ints(model["recorded_layers"])),
                ),
                status=str(raw["status"]),
                created=str(raw.get("created", "")),
                updated=str(raw.get("updated", "")),
                last_step=int(raw.get("last_step", 0)),
                warm_start=raw.get("warm_start"),
                final_accuracy=(raw.get("final") or {}).get("accuracy"),
                error=raw.get("error"),
                warnings=tuple(_strs(raw.get("warnings", []))),
                environment=dict(raw.get("environment") or {}),
                writer=dict(raw.get("writer") or {}),
                moestab_version=str(raw.get("moestab_version", "")),
                schema_version=version,
                path=source.parent,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunFileError(source, f"does not follow the run format ({type(exc).__name__}: {exc})") from exc
        for key in ("algo", "routing_replay", "model", "steps"):
            if key not in info.config:
                raise RunFileError(source, f"config lacks {key!r}")
        problem = _implausible(info.model, info.last_step)
        if problem:
            raise RunFileError(source, problem)
        if info.replay not in schema.REPLAY_MODES:
            raise RunFileError(source, f"config.routing_replay {info.replay!r} is not one of {schema.REPLAY_MODES}")
        if info.status not in schema.STATUSES:
            raise RunFileError(source, f"status {info.status!r} is not one of {schema.STATUSES}")
        return info


def _strs(values: Any) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"expected a list of strings, got {values!r}")
    return values


def _implausible(model: ModelInfo, last_step: int) -> str | None:
    """What in run.json's model description (or ``last_step``) no run could have written, or None."""
    if model.num_experts < 1:
        return f"model.num_experts is {model.num_experts}; a MoE layer has at least 1 expert"
    if not 1 <= model.top_k <= model.num_experts:
        return f"model.top_k is {model.top_k}; valid: 1..num_experts ({model.num_experts})"
    for name, layers in (("moe_layers", model.moe_layers), ("recorded_layers", model.recorded_layers)):
        if any(layer < 0 for layer in layers) or len(set(layers)) != len(layers):
            return f"model.{name} {list(layers)} must be distinct layer indices >= 0"
    if not set(model.recorded_layers) <= set(model.moe_layers):
        return f"model.recorded_layers {list(model.recorded_layers)} are not all MoE layers ({list(model.moe_layers)})"
    if last_step < 0:
        return f"last_step is {last_step}; valid: 0 or more"
    return None


def _ints(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"expected a list of integers, got {values!r}")
    return values


def read_run_info(run: str | Path) -> RunInfo:
    """Read ``RUN/run.json``.

    Raises :class:`NotARunError` if ``run`` is not a folder with a run.json, :class:`RunFileError` if
    run.json is not valid JSON in the run format, and :class:`SchemaVersionError` if its schema version
    is not one this moestab reads (:data:`~moestab.run_folder.schema.OLDEST_READ_VERSION` to
    :data:`~moestab.run_folder.schema.SCHEMA_VERSION`).
    """
    path = Path(run)
    if not path.is_dir():
        raise NotARunError(f"{path} is not a moestab run folder: not a directory")
    run_json = path / schema.RUN_JSON
    if not run_json.is_file():
        raise NotARunError(f"{path} is not a moestab run folder: it has no {schema.RUN_JSON}")
    try:
        raw = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFileError(run_json, f"unreadable or not valid JSON ({exc})") from exc
    return RunInfo.from_json(raw, run_json)

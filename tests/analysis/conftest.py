"""A synthetic run folder written with pyarrow exactly as docs/run-format.md describes.

The fixture keeps the raw arrays it wrote, so that tests can recompute every analysis result
independently (plain Python sets and loops) and compare.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from moestab.records import schema


@dataclass
class FakeRun:
    """What :func:`write_run` wrote."""

    path: Path
    num_layers: int
    recorded_layers: list[int]
    num_experts: int
    top_k: int
    steps: list[int]
    tokens: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    """Per step, column -> array (routes as [rows, layers, top_k], margin as [rows, layers])."""
    metrics: list[dict] = field(default_factory=list)
    run_json: dict = field(default_factory=dict)


def _distinct(rng: np.random.Generator, rows: int, layers: int, k: int, experts: int) -> np.ndarray:
    """Random routes: k distinct experts per (row, layer), random order."""
    return np.argsort(rng.random((rows, layers, experts)), axis=2)[:, :, :k].astype(np.int16)


def _perturb(rng: np.random.Generator, routes: np.ndarray, prob: np.ndarray, experts: int) -> np.ndarray:
    """Replace one slot by an expert outside the set where ``rng < prob`` ([rows, layers]); also
    reorder some unchanged decisions (a reorder is not a flip)."""
    out = routes.copy()
    rows, layers, k = routes.shape
    for t in range(rows):
        for layer in range(layers):
            u = rng.random()
            if u < prob[t, layer]:
                outside = [e for e in range(experts) if e not in set(out[t, layer].tolist())]
                out[t, layer, rng.integers(k)] = rng.choice(outside)
            elif u < prob[t, layer] + 0.2:
                out[t, layer] = out[t, layer][::-1]
    return out


def _list_column(values: np.ndarray, value_type: pa.DataType) -> pa.FixedSizeListArray:
    rows = values.shape[0]
    width = int(np.prod(values.shape[1:]))
    flat = pa.array(values.reshape(rows * width), type=value_type)
    return pa.FixedSizeListArray.from_arrays(flat, width)


def write_run(
    root: Path,
    name: str = "run_a",
    *,
    steps: int = 3,
    seqs: int = 8,
    num_layers: int = 4,
    recorded_layers: tuple[int, ...] = (0, 2, 3),
    num_experts: int = 8,
    top_k: int = 2,
    seed: int = 0,
    status: str = "finished",
    final_accuracy: float | None = 0.75,
) -> FakeRun:
    """Write a complete run folder under ``root / name``."""
    rng = np.random.default_rng(seed)
    path = root / name
    (path / schema.TOKENS_DIR).mkdir(parents=True)
    (path / schema.STATE_DIR).mkdir()
    layers = len(recorded_layers)
    run = FakeRun(path, num_layers, list(recorded_layers), num_experts, top_k, list(range(1, steps + 1)))
    for step in run.steps:
        lengths = rng.integers(3, 11, seqs)  # response lengths
        seq = np.repeat(np.arange(seqs), lengths).astype(np.int32)
        position = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
        rows = seq.size
        reward = rng.integers(0, 2, seqs).astype(np.float32)[seq]
        logp_old = (-rng.random(rows) * 3).astype(np.float32)
        logp_rollout = (logp_old + rng.normal(0, 0.4, rows)).astype(np.float32)
        logp_old_free = (logp_old + rng.normal(0, 0.2, rows)).astype(np.float32)
        logp_update = (logp_old + rng.normal(0, 0.5, rows)).astype(np.float32)
        logp_new = (logp_update + rng.normal(0, 0.1, rows)).astype(np.float32)
        log_w = (logp_update - logp_old).astype(np.float32)
        margin = rng.exponential(1.0, (rows, layers)).astype(np.float32)
        flip_prob = np.clip(0.6 * np.exp(-2 * margin), 0, 1)  # near-ties flip more
        routes_old = _distinct(rng, rows, layers, top_k, num_experts)
        routes_update = _perturb(rng, routes_old, flip_prob, num_experts)
        routes_new = _perturb(rng, routes_old, flip_prob, num_experts)
        routes_rollout = _perturb(rng, routes_old, np.full((rows, layers), 0.15), num_experts)
        routes_rollout[rng.random(rows) < 0.1, 0, 0] = -1  # some layer-0 routes not recorded
        routes_old_free = _perturb(rng, routes_old, np.full((rows, layers), 0.1), num_experts)
        margin[0, 1] = np.nan
        cols = {
            schema.COL_STEP: np.full(rows, step, np.int32),
            schema.COL_SEQ: seq,
            schema.COL_PROMPT: (seq // 2).astype(np.int32),
            schema.COL_MINIBATCH: (seq % 2).astype(np.int16),
            schema.COL_POSITION: position,
            schema.COL_RESPONSE_LEN: lengths[seq].astype(np.int32),
            schema.COL_REWARD: reward,
            schema.COL_ADVANTAGE: (reward - reward.mean()).astype(np.float32),
            schema.COL_LOGP_ROLLOUT: logp_rollout,
            schema.COL_LOGP_OLD: logp_old,
            schema.COL_LOGP_OLD_FREE: logp_old_free,
            schema.COL_LOGP_UPDATE: logp_update,
            schema.COL_LOGP_NEW: logp_new,
            schema.COL_LOG_W: log_w,
            schema.COL_CLIPPED: np.abs(log_w) > 0.3,
            schema.COL_ROUTES_ROLLOUT: routes_rollout,
            schema.COL_ROUTES_OLD: routes_old,
            schema.COL_ROUTES_OLD_FREE: routes_old_free,
            schema.COL_ROUTES_UPDATE: routes_update,
            schema.COL_ROUTES_NEW: routes_new,
            schema.COL_MARGIN_OLD: margin,
        }
        run.tokens[step] = cols
        arrays = {}
        for key, values in cols.items():
            if key in schema.ROUTE_COLUMNS:
                arrays[key] = _list_column(values, pa.int16())
            elif key == schema.COL_MARGIN_OLD:
                arrays[key] = _list_column(values, pa.float32())
            else:
                arrays[key] = pa.array(values)
        # Small row groups so that streaming crosses row-group boundaries.
        pq.write_table(pa.table(arrays), path / schema.tokens_file(step), row_group_size=16)
        run.metrics.append(_metrics_line(step, cols, layers, top_k, rng))
    run.metrics[0]["eval/accuracy"] = 0.5  # eval steps only
    run.metrics[-1]["eval/accuracy"] = 0.625
    lines = [json.dumps(m) for m in run.metrics]
    (path / schema.METRICS_JSONL).write_text("\n".join(lines) + "\n")
    for step in (2,):
        ckpt = path / schema.checkpoint_dir(step)
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text("{}")
    (path / schema.CHECKPOINTS_DIR / ".step_000003.tmp").mkdir()  # an unfinished checkpoint: not listed
    run.run_json = {
        "schema_version": schema.SCHEMA_VERSION,
        "moestab_version": "0.1.0",
        "status": status,
        "created": "2025-01-01T00:00:00Z",
        "updated": "2025-01-01T01:00:00Z",
        "config": {"algo": "gspo", "routing_replay": "rollout", "model": "embedded", "steps": steps + 2},
        "model": {
            "family": "qwen3_moe",
            "num_layers": num_layers,
            "moe_layers": list(range(num_layers)),
            "num_experts": num_experts,
            "top_k": top_k,
            "recorded_layers": list(recorded_layers),
        },
        "warm_start": {"accuracy": 0.25, "path": "/base"},
        "last_step": steps,
        **({"final": {"accuracy": final_accuracy}} if final_accuracy is not None else {}),
    }
    (path / schema.RUN_JSON).write_text(json.dumps(run.run_json))
    (path / schema.CONFIG_YAML).write_text("algo: gspo\nrouting_replay: rollout\n")
    return run


def _metrics_line(step: int, cols: dict, layers: int, top_k: int, rng: np.random.Generator) -> dict:
    """A metrics.jsonl line with every key of the run format (values need not match the tokens)."""
    by_layer = [float(x) for x in rng.random(layers) * 0.2]
    mismatch = {}
    for pair, (rollout, trainer) in schema.LOGP_PAIRS.items():
        d = cols[trainer].astype(np.float64) - cols[rollout]
        mismatch[f"mismatch/{pair}/k1"] = float(np.mean(-d))
        mismatch[f"mismatch/{pair}/k3"] = float(np.mean(np.expm1(d) - d))
        mismatch[f"mismatch/{pair}/f2"] = float(np.mean(np.abs(d) > math.log(2)))
    return {
        "step": step,
        "time/step_s": 1.0,
        "time/rollout_s": 0.5,
        "time/update_s": 0.5,
        "reward/mean": float(cols[schema.COL_REWARD].mean()),
        "reward/std": 0.5,
        "accuracy": 0.1 * step,
        "response/length_mean": 6.0,
        "response/length_max": 10,
        "loss": 0.01,
        "grad_norm": 1.0,
        "entropy": None,  # NaN is written as null
        "loss/objective/policy_loss": 0.01,
        "clip/token_frac": 0.1,
        "clip/token_frac_later": 0.2,
        "clip/seq_frac": 0.15,
        "clip/seq_frac_later": 0.3,
        "routing_share/var_share": 0.1 * step,  # written with --routing-share only
        "routing/old_new/changed": float(np.mean(by_layer)),
        "routing/old_new/router_flip": 0.2,
        "routing/old_new/changed_by_layer": by_layer,
        "routing/old_new/token_flip": 0.3,
        "routing/rollout_old/changed": 0.0,
        "routing/rollout_old/router_flip": 0.0,
        "routing/rollout_old/changed_by_layer": [0.0] * layers,
        "routing/rollout_old/token_flip": 0.0,
        "routing/rollout_old_free/changed": 0.05 * step,
        "routing/rollout_old_free/router_flip": 0.08 * step,
        "routing/rollout_old_free/changed_by_layer": [0.05 * step] * layers,
        "routing/rollout_old_free/token_flip": 0.2,
        "routing/update_old/changed_by_minibatch": None,
        **mismatch,
        "experts/load": [[1 / 8] * 8 for _ in range(layers)],
        "experts/load_entropy": [math.log(8)] * layers,
    }


@pytest.fixture
def fake_run(tmp_path: Path) -> FakeRun:
    return write_run(tmp_path)


@pytest.fixture
def cli_main(monkeypatch: pytest.MonkeyPatch):
    """``moestab.cli.main`` with only the subcommands whose modules exist (others are being written)."""
    from moestab import cli

    available = {
        name: module
        for name, module in cli.SUBCOMMANDS.items()
        if importlib.util.find_spec(f"moestab.commands.{module}") is not None
    }
    monkeypatch.setattr(cli, "SUBCOMMANDS", available)
    return cli.main

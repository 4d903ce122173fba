"""Fake run folders for the tests, built three ways on purpose: each way tests a different owner.

- :func:`write_run`: every file written with pyarrow and json exactly as docs/run-format.md describes, never through
  moestab's writer, keeping the raw arrays it wrote (:class:`FakeRun`), so the readers and analyzers are checked
  against an independent writer and their results recomputed with plain Python (tests/analysis, tests/run_folder'
  readers, the dashboard).
- :func:`a_run`: run.json (and checkpoints) through moestab's own ``RunWriter`` / ``RunFolder``: a folder whose
  lock, status and checkpoint rules are the library's (tests/run_folder/test_folder.py and the run-lifetime tests).
- :func:`diagnostics_run`: a run written by the public ``DiagnosticsRun`` (what a framework integration writes:
  metrics.jsonl and run.json, no token tables), for the readers of such runs.

A test that needs only one file (a run.json with one odd field, a damaged table) writes that file itself.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moestab.analysis.synthetic import synthetic_routes
from moestab.run_folder import RunFolder, schema
from moestab.run_folder.run_info import ModelInfo
from moestab.run_folder.writer import RunWriter


# ---- written as docs/run-format.md describes, independently of moestab's writer ---------------------------------
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



# ---- through moestab's RunWriter: the library's own folder rules -----------------------------------------------
MODEL = ModelInfo(family="qwen3_moe", moe_layers=(0, 1), num_experts=8, top_k=2, recorded_layers=(0, 1))


def a_run(path, *, status: str = schema.STATUS_FINISHED, last_step: int = 1, checkpoints=()) -> RunFolder:
    """A run folder with run.json ``status`` and a complete checkpoint of each step in ``checkpoints``."""
    writer = RunWriter(path)
    config = {"algo": "gspo", "routing_replay": "off", "model": "embedded", "steps": 3}
    writer.start(config=config, model=MODEL, environment={}, config_yaml="steps: 3\n")
    writer.update(status=status, last_step=last_step)
    folder = RunFolder(path)
    for step in checkpoints:
        folder.save_checkpoint(step, training_state(step), whole_model_folder, weights_bytes=0)
    return folder


def training_state(step: int) -> bytes:
    """What ``torch.save`` makes of a training state: a zip archive with its data.pkl."""
    import torch

    buffer = io.BytesIO()
    torch.save({"step": step, "optimizer": {"state": {}, "param_groups": []}, "loop": {}}, buffer)
    return buffer.getvalue()


def whole_model_folder(tmp) -> None:
    """A checkpoint's model folder as ``save_pretrained`` leaves it: config.json and a whole safetensors file."""
    import torch
    from safetensors.torch import save_file

    tmp.mkdir()
    (tmp / "config.json").write_text("{}")
    save_file({"w": torch.ones(2, 3)}, tmp / "model.safetensors")



# ---- through DiagnosticsRun, as a framework integration writes a run ------------------------------------------
def diagnostics_run(path, steps: int = 3, **options):
    """A ``DiagnosticsRun`` of ``steps`` steps at ``path`` (verl, R3, 4 layers, top-2 of 8) with synthetic routes;
    returns the two route arrays every step compared ``(rollout, trainer)``."""
    from moestab.recording.diagnostics import DiagnosticsRun, route_diagnostics  # torch: only where used

    a, b = synthetic_routes(200, 4, 2, 8, flip=0.2, reorder=0.1, seed=7)
    gen = np.random.default_rng(0)
    logp = -gen.random(200) - 0.2  # [tokens] at most -0.2: the trainer's side below, 0.05 per step above, stays < 0
    with DiagnosticsRun(path, trainer="verl", replay="rollout", layers=range(4), num_experts=8, top_k=2,
                        steps=steps, **options) as run:
        for step in range(1, steps + 1):
            run.log(step, route_diagnostics(a, b, logp_rollout=logp, logp_trainer=logp + 0.05 * step, aliases=True))
    return a, b

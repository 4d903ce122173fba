"""Every key moestab writes or prints is documented: metrics.jsonl and `moestab analyze` in docs/metrics.md,
per-token columns in docs/run-format.md."""

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from moestab.analysis.summary import SUMMARY_COLUMNS, SUMMARY_KEYS
from moestab.metrics import keys as metric_keys
from moestab.run_folder import schema
from moestab.train import train
from moestab.train.key_owners import key_owners
from tests.support.train import tiny_config

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented(name: str) -> set[str]:
    """Every `backquoted` word of a doc."""
    return set(re.findall(r"`([^`\s]+)`", (DOCS / name).read_text()))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-run")
    # RSPO with a KL penalty writes the conditional keys too (loss/rspo/*, loss/kl/ref_k3).
    train(tiny_config(root / "run", root / "cache", steps=1, algo="rspo", kl_coef=0.01), log=lambda s: None)
    return root / "run"


def test_every_metrics_key_is_documented(run_dir):
    (line,) = [json.loads(x) for x in (run_dir / schema.METRICS_JSONL).read_text().splitlines()]
    missing = sorted(set(line) - documented("metrics.md"))
    assert not missing, f"metrics.jsonl keys missing from docs/metrics.md: {missing}"
    assert {"loss/rspo/gamma_mean", "loss/kl/ref_k3", "eval/accuracy"} <= set(line)  # the conditional ones ran


def test_the_metrics_key_reference_is_generated_from_the_key_table():
    text = (DOCS / "metrics.md").read_text()
    assert metric_keys.with_reference(text, key_owners()) == text, ("docs/metrics.md's key reference differs from "
                                                      "moestab/metrics/keys.py: run python scripts/metric_docs.py")
    with pytest.raises(ValueError, match="between one"):
        metric_keys.with_reference(text.replace(metric_keys.END_MARKER, ""), key_owners())
    assert set(SUMMARY_KEYS.values()) <= set(metric_keys.KEYS)  # analyze averages declared keys


def test_every_analyze_key_is_documented():
    missing = sorted(set(SUMMARY_COLUMNS) - documented("metrics.md"))
    assert not missing, f"moestab analyze keys missing from docs/metrics.md: {missing}"


def test_every_token_column_is_documented(run_dir):
    columns = pq.read_schema(run_dir / schema.tokens_file(1)).names
    missing = sorted(set(columns) - documented("run-format.md"))
    assert not missing, f"per-token columns missing from docs/run-format.md: {missing}"


def test_every_run_json_key_is_documented(run_dir):
    info = json.loads((run_dir / schema.RUN_JSON).read_text())
    keys = set(info) | {f"model.{k}" for k in info["model"]} | {f"environment.{k}" for k in info["environment"]}
    text = (DOCS / "run-format.md").read_text()
    missing = sorted(k for k in keys if f"`{k.split('.')[-1]}`" not in text)
    assert not missing, f"run.json keys missing from docs/run-format.md: {missing}"

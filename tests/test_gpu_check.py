"""bench/gpu_check.sh (issue 38) runs on a CPU at toy size, so the GPU check cannot rot between GPU loans.

The GPU machine is lent rarely and briefly: a script that breaks there costs the loan. Here every section runs the
code the GPU run runs (``--device cpu --tiny``) and the log and the CSV are checked for each section's rows; the
numbers are toy numbers and are not checked.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
SECTIONS = ("env", "sync", "overhead", "gap", "train", "fullsize")


def run_script(out: Path, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(["bash", str(SCRIPT), str(out), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


def rows(out: Path) -> list[dict[str, str]]:
    with (out / "gpu_check.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def quantities(table: list[dict[str, str]], section: str, **match: str) -> list[dict[str, str]]:
    return [r for r in table if r["section"] == section and all(r[k] == v for k, v in match.items())]


@pytest.mark.slow
def test_the_tiny_cpu_run_writes_every_sections_rows(tmp_path):
    out = tmp_path / "out"
    done = run_script(out, "--device", "cpu", "--tiny", "--work", str(tmp_path / "work"))
    log = (out / "gpu_check.log").read_text()
    assert done.returncode == 0, log[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.csv", "gpu_check.log"]  # OUT holds these two only
    assert "0 failure(s)" in log
    for name in SECTIONS:
        assert f"\n== {name} ==" in log
    table = rows(out)
    assert not [r for r in table if r["quantity"] == "error"]
    assert {r["section"] for r in table if r["quantity"] == "section wall time"} == set(SECTIONS)

    assert {r["quantity"] for r in quantities(table, "env")} >= {"torch", "transformers", "device"}
    sync = quantities(table, "sync", quantity="host syncs in hooks")
    assert len(sync) == 2 * 7 and {r["value"] for r in sync} == {"0"}  # (a), (b) x 7 cases, none synchronised
    ratios = quantities(table, "overhead", quantity="ratio")
    # per model: 4 modes x (no-grad forward, forward + backward) + 2 recorded generate() modes
    assert len(ratios) == 2 * (4 * 2 + 2) and all(float(r["value"]) > 0 for r in ratios)
    flips = quantities(table, "gap", quantity="routers flipped %")
    assert len(flips) == 2 * 2  # two models x (float32, bfloat16 trainer)
    assert {r["case"] for r in flips} == {"rollout bfloat16 vs trainer float32", "rollout bfloat16 vs trainer bfloat16"}
    assert len(quantities(table, "gap", quantity="k3")) == 2 * 2 * 3  # x (free, R3, TRR)
    steps = quantities(table, "train", quantity="step time, median after the first")
    assert sorted(r["case"].split(",")[0] for r in steps) == ["--routing-replay off", "--routing-replay rollout"]
    full = {r["quantity"] for r in quantities(table, "fullsize")}
    assert {"layers", "generate() time, recorded", "recorder's extra peak memory", "routes kept"} <= full


def test_a_missing_package_is_named_before_anything_runs(tmp_path):
    """A Python without the packages (here: isolated from every site-packages) gets their names and the way to bring
    them as wheels, and the check does not start."""
    python = tmp_path / "bare-python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    done = run_script(out, "--device", "cpu", "--tiny", python=str(python))
    log = (out / "gpu_check.log").read_text()
    assert done.returncode == 3
    assert "missing Python packages: torch transformers numpy pandas pyarrow pyyaml tqdm" in log
    assert "pip download --no-deps --only-binary=:all:" in log and ".whl" in log
    assert not (out / "gpu_check.csv").exists()

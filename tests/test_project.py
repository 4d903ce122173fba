"""Project wiring: README's commands, CI script, console script."""

import re
from pathlib import Path

from moestab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_readme_main_command_is_the_default_training_job():
    assert "bash scripts/setup.sh && .venv/bin/moestab train --routing-replay off" in readme_commands()


def test_cli_lists_its_subcommands():
    help_text = build_parser().format_help()
    for name in ("train", "analyze"):
        assert name in help_text


def test_layers_import_downwards_only():
    # The trainer computes its metrics with moestab.metrics (as the analyzers do), never through the
    # analyzers; the analyzers and the metric definitions never import torch (the dashboard stays light).
    import subprocess
    import sys

    def loaded(imports: str, module: str) -> bool:
        code = f"import sys\nimport {imports}\nprint({module!r} in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
        return out.stdout.split() == ["True"]

    assert not loaded("moestab.train.loop", "moestab.analysis")
    assert not loaded("moestab.analysis.summary, moestab.analysis.attribution, moestab.analysis.plots", "torch")
    assert not loaded("moestab.metrics.routes, moestab.metrics.mismatch, moestab.metrics.ratios", "torch")
    assert loaded("moestab.train.loop", "moestab.metrics.routes")  # the check can fail

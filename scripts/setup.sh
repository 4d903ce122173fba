#!/usr/bin/env bash
# Create .venv and install moestab into it (editable), at the versions CI tests (constraints.txt).
# Usage: scripts/setup.sh [dev]
#   (no argument): moestab with what README's commands use: the dashboard, plots and notebooks extras;
#   dev: every extra ([all]: also TRL and the --report-to trackers) and the test tools (pytest, ruff, megatron-core,
#        Playwright, DuckDB), and headless Chromium for the browser test.
# `pip install moestab` alone is the light core a trainer's environment needs (README, "Install").
# Newer releases inside pyproject's range: scripts/test_tier.sh newest (a separate .venv-newest).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# constraints.txt pins torch to the local CPU wheel on this project's machines and everything else to the tested set.
# (The grep only hides this machine's pip-config noise; pipefail keeps pip's own exit status.)
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
  -e ".[${1:-dashboard,plots,notebooks}]" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
if [ "${1:-}" = "dev" ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: could not install chromium; the browser test will be skipped" >&2
  else
    echo "setup: chromium not found and cannot apt-get it; the browser test will be skipped" >&2
  fi
fi
.venv/bin/python -c "import moestab, torch, transformers; print('moestab', moestab.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"

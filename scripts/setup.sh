#!/usr/bin/env bash
# Create .venv and install moestab into it (editable), at the versions CI tests (constraints.txt).
# Usage: scripts/setup.sh [dev]
#   (no argument): moestab with what README's commands use: the dashboard, plots and notebooks extras;
#   dev: every extra ([all]: also TRL and the --report-to trackers) and the test tools (pytest, ruff, megatron-core,
#        Playwright, DuckDB), and headless Chromium for the browser test.
# `pip install moestab` alone is the light core a trainer's environment needs (README, "Install").
# Newer releases inside pyproject's range: scripts/test_tier.sh newest (a separate .venv-newest).
# Each step says what it does first ("setup: ..."): pip itself runs quietly and the first install takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup: $*"; }
EXTRAS=${1:-dashboard,plots,notebooks}
START=$SECONDS

if [ -d .venv ]; then
  say "virtual environment $(pwd)/.venv exists: installing into it ($(python3 --version))"
else
  say "creating the virtual environment $(pwd)/.venv ($(python3 --version))"
fi
python3 -m venv .venv
say "installing moestab from $(pwd) (editable) with the extras [$EXTRAS], at the versions of constraints.txt:"
# Each extra's requirements as pyproject.toml declares them (information only: never stops the set-up).
.venv/bin/python - "$EXTRAS" <<'EOF' || true
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
for name in sys.argv[1].split(","):
    print(f"setup:   [{name}]: {', '.join(extras.get(name, ['(not an extra of pyproject.toml)']))}")
EOF
say "  and the core: $(grep -E '^(torch|transformers|pandas|pyarrow)==' constraints.txt | tr '\n' ' ')"
say "  torch's wheel is the large one; pip prints nothing until it is done (minutes the first time)"
# constraints.txt pins torch to the local CPU wheel on this project's machines and everything else to the tested set.
# (The grep only hides this machine's pip-config noise; pipefail keeps pip's own exit status.)
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
  -e ".[$EXTRAS]" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
say "pip done ($((SECONDS - START)) s so far)"
if [ "${1:-}" = "dev" ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing chromium with apt-get (headless browser for the dashboard's browser test)"
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: could not install chromium; the browser test will be skipped" >&2
  else
    echo "setup: chromium not found and cannot apt-get it; the browser test will be skipped" >&2
  fi
fi
say "checking the install (imports moestab, torch and transformers)"
.venv/bin/python -c "import moestab, torch, transformers; print('moestab', moestab.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
say "done in $((SECONDS - START)) s: .venv/bin/moestab --help lists the commands"

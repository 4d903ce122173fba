#!/usr/bin/env bash
# The fast test tier in a fresh venv at one end of pyproject's declared range (CI runs both; run them yourself to
# try newer releases before the lock is refreshed).
#   scripts/test_tier.sh newest   the newest versions the registry serves inside the declared range
#   scripts/test_tier.sh oldest   the declared lower bounds of transformers, pandas, pyarrow, streamlit and trl
# torch stays on the version of constraints.txt (the CPU wheel set-up installs) in both tiers. Extra arguments go
# to pytest. The venv is .venv-<tier>, made anew each time.
set -euo pipefail
cd "$(dirname "$0")/.."
tier="${1:-}"
shift || true
case "$tier" in
  newest|oldest) ;;
  *) echo "usage: scripts/test_tier.sh newest|oldest [pytest args]" >&2; exit 2 ;;
esac
venv=".venv-$tier"
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
python3 scripts/tier_constraints.py "$tier" > "$pins"
echo "tier $tier: pins $(tr '\n' ' ' < "$pins")"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade -c "$pins" -e ".[dev]" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
"$venv/bin/python" -c "
import importlib.metadata as m
print('tier $tier:', ' | '.join(f'{p} {m.version(p)}' for p in
      ('torch', 'transformers', 'pandas', 'pyarrow', 'streamlit', 'trl')))"
"$venv/bin/python" -m pytest -m "not slow" -q -p no:cacheprovider "$@"

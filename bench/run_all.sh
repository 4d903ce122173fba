#!/usr/bin/env bash
# Every benchmark docs/benchmarks.md reports, one after the other on one machine, each log beside its command.
#
#   bash bench/run_all.sh [OUT]        # OUT default: runs/benchmarks-<UTC date>
#
# Run it on an otherwise idle machine (nothing else running: the logs record the load average before and after
# each benchmark). Takes about an hour on the 2-core CPU machine. Each benchmark's output goes to OUT/<name>.log,
# starting with its command; docs/benchmarks.md quotes them.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/benchmarks-$(date -u +%Y-%m-%d)}
mkdir -p "$OUT"
PY=.venv/bin/python
DEFAULT_FRACTION=$($PY -c "from moestab.train import TrainConfig; print(TrainConfig().measure_fraction)")
DEFAULT_EVERY=$($PY -c "from moestab.train import TrainConfig; print(TrainConfig().measure_every)")

run() {  # run NAME COMMAND...: the command's output in OUT/NAME.log, with the load before and after
  local name=$1; shift
  {
    echo "\$ $*"
    echo "# $(date -u +%FT%TZ), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$@" 2>&1
    echo "# $(date -u +%FT%TZ), load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$OUT/$name.log"
  echo "$name done"
}

run routing-2threads $PY bench/bench_routing.py --rounds 15 --threads 2
run routing-trainer $PY bench/bench_routing.py --rounds 100 --threads 1 --skip-large
run analysis $PY bench/bench_analysis.py
run collapse-watch $PY bench/bench_collapse_watch.py --steps 20000 --rounds 5
run diagnostics $PY bench/bench_diagnostics.py --rounds 3
run train-budget1 $PY bench/bench_train.py --threads 1 --rounds 20 --micro-rounds 30 --prompts 32 --measure-fraction 1 \
  --measure-every 1
# The default budget measures one step in DEFAULT_EVERY: each sample is a block of that many steps (20 blocks)
run train-default $PY bench/bench_train.py --threads 1 --rounds $((20 * DEFAULT_EVERY)) --micro-rounds 30 --prompts 32 \
  --measure-fraction "$DEFAULT_FRACTION" --measure-every "$DEFAULT_EVERY"
run train-every2 $PY bench/bench_train.py --threads 1 --rounds 40 --micro-rounds 5 --prompts 32 --measure-every 2
run train-sort32 $PY bench/bench_train.py --threads 2 --rounds $((3 * DEFAULT_EVERY)) --micro-rounds 5 \
  --task sort:length=32 --measure-fraction "$DEFAULT_FRACTION" --measure-every "$DEFAULT_EVERY"
run routing-share $PY bench/bench_train.py --routing-share-only --threads 1 --rounds 10
run probe $PY bench/bench_probe.py --threads 2 --rounds 7
run trl-budget1 $PY bench/bench_trl_callback.py --pairs 20 --threads 1 --measure-fraction 1.0
run trl-sort32 $PY bench/bench_trl_callback.py --pairs 8 --threads 1 --task sort:length=32
run trl-routing-share $PY bench/bench_trl_callback.py --pairs 10 --threads 1 --routing-share
run fine-grained $PY scripts/fine_grained_bench.py --warm-start --steps 10 --prompts 32 --threads 1 --seeds 0 1 2 \
  --models embedded:fine embedded embedded:dense
# What a fraction below 1 buys (the default measures whole steps), and the issue's own setting (16 prompts) at budget 1
# and at the default budget
run train-budget025 $PY bench/bench_train.py --threads 1 --rounds 20 --micro-rounds 30 --prompts 32 \
  --measure-fraction 0.25
run train-16prompts-budget1 $PY bench/bench_train.py --threads 1 --rounds 20 --micro-rounds 30 --measure-fraction 1
run train-16prompts-default $PY bench/bench_train.py --threads 1 --rounds $((10 * DEFAULT_EVERY)) --micro-rounds 5 \
  --measure-every "$DEFAULT_EVERY"
run trl-budget025 $PY bench/bench_trl_callback.py --pairs 20 --threads 1 --measure-fraction 0.25
run analysis-sizes $PY bench/bench_analysis.py --sizes
# Issue 43: the streamed analysis with the column stored in full uncompressed (to compare), streaming's peak memory at
# a quarter and 4x a Qwen3-30B-A3B step, and the memory of recording a step
run analysis-plain-full $PY bench/bench_analysis.py --versions 4 --full-codec none --skip-memory
run analysis-250k $PY bench/bench_analysis.py --versions 3 4 --rounds 1 --skip-memory --tokens 250000
run analysis-4m $PY bench/bench_analysis.py --versions 3 4 --rounds 1 --skip-memory --tokens 4000000
run recording-memory $PY bench/bench_recording_memory.py --sequences 32 64 128 256 512
run trl-gather-memory $PY bench/bench_recording_memory.py --trl-parts 8 --sequences 32 64 128 256
run route-codecs $PY bench/bench_route_codecs.py
# Budget 1 against the code issue 28 measured, side by side (ratios of other days do not compare)
run ab-2fa08e0 bash bench/ab_commit.sh 2fa08e0 3
# moestab --help / --version / train --help start-up, against the commit before it was made light (issue 39.6)
run startup $PY bench/bench_startup.py --before 487c8e6 --rounds 20
echo "logs in $OUT"

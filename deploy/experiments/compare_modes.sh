#!/usr/bin/env bash
# Experiment (not a test; minutes of run time): sync, async and SSP(2) on the Quick start job with one worker
# slowed on purpose, beside the single-process baseline, each to 0.85 test accuracy. Ends in a table and an
# SVG plot of test accuracy against wall-clock time.
#
#   deploy/experiments/compare_modes.sh [SLOWDOWN_MS] [OUT_DIR]     # defaults: 20, runs/compare-<time>
set -euo pipefail
cd "$(dirname "$0")/../.."
slowdown_ms="${1:-20}"
out="${2:-runs/compare-$(date +%Y%m%d-%H%M%S)}"
bin="${TESSERA_BUILD_DIR:-build}/bin"
[[ -x "$bin/tessera-launch" ]] || bash deploy/build.sh
mkdir -p "$out"
for mode in sync async ssp2; do
  echo "== $mode, worker 1 slowed by ${slowdown_ms} ms per step"
  "$bin/tessera-launch" --job="deploy/jobs/fashion_mnist_mlp_$mode.pbtxt" --run_dir="$out/$mode" \
    --slow_worker=1 --inject_slowdown_ms="$slowdown_ms" | tail -2
done
echo "== local baseline"
"$bin/tessera-worker" --local --job=deploy/jobs/fashion_mnist_mlp_local.pbtxt --run_dir="$out/local" 2>/dev/null | tail -1
python3 deploy/experiments/plot_runs.py "$out" "$out/sync" "$out/async" "$out/ssp2" "$out/local"

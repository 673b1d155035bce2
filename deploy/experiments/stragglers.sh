#!/usr/bin/env bash
# Experiment (not a test; about 7 minutes on 2 cores): how each consistency mode copes with stragglers. The
# Quick start model on 4 workers and 2 servers, batch 256 per worker (so that compute, not the exchange,
# dominates a step and a slow device shows), trained for a fixed wall time in seven modes, under two kinds of
# straggler:
#   slow    worker 3 computes 4 times slower throughout (a slower GPU)
#   stalls  every step of every worker stalls with probability 0.1 for 200 ms (seeded)
# Modes: sync, sync + balance THROUGHPUT, sync + 1 backup worker, async (with and without the staleness-aware
# step), SSP(1), SSP(3). Writes OUT/results.csv, OUT/results.md and OUT/<scenario>.png (test accuracy against
# wall seconds and against model updates, and each mode's staleness distribution).
#
#   deploy/experiments/stragglers.sh [OUT_DIR] [SECONDS_PER_RUN]     # defaults: runs/stragglers-<time>, 25
# Environment: SCENARIOS="slow stalls", MODES="sync balance backup async async_salr ssp1 ssp3" pick a subset;
# STALL_P, STALL_MS, SLOW_FACTOR change the stragglers.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
out="${1:-runs/stragglers-$(date +%Y%m%d-%H%M%S)}"
seconds="${2:-25}"
# The plots need matplotlib: Debian's python3-matplotlib, for Debian's python3 (another python3 first on the PATH
# may not see it).
py=python3
"$py" -c "import matplotlib" 2>/dev/null || py=/usr/bin/python3
"$py" -c "import matplotlib" 2>/dev/null || {
  echo "stragglers.sh: the plots need matplotlib: apt-get install python3-matplotlib" >&2
  exit 2
}
mkdir -p "$out"
common="cluster { num_workers: 4 num_servers: 2 } batch_size: 256
stop { max_seconds: $seconds target_accuracy: 0 epochs: 0 }
eval_every_steps: 20 eval_every_seconds: 1"
declare -A modes=(
  [sync]="consistency { mode: SYNC }"
  [balance]="consistency { mode: SYNC balance: THROUGHPUT }"
  [backup]="consistency { mode: SYNC backup_workers: 1 }"
  [async]="consistency { mode: ASYNC }"
  [async_salr]="consistency { mode: ASYNC staleness_aware_lr: true }"
  [ssp1]="consistency { mode: SSP staleness: 1 }"
  [ssp3]="consistency { mode: SSP staleness: 3 }")
declare -A stragglers=(
  [slow]="--slow_worker=3 --slow_factor=${SLOW_FACTOR:-4}"
  [stalls]="--stall_probability=${STALL_P:-0.1} --stall_ms=${STALL_MS:-200} --stall_seed=1")
for scenario in ${SCENARIOS:-slow stalls}; do
  for mode in ${MODES:-sync balance backup async async_salr ssp1 ssp3}; do
    echo "== $scenario: $mode"
    # shellcheck disable=SC2086  # the straggler flags are several words
    "$bin/tessera-launch" --linger_s=0 --overwrite --job=deploy/jobs/fashion_mnist_mlp_sync.pbtxt --run_dir="$out/$scenario/$mode" \
      --device=cpu ${stragglers[$scenario]} --job_override="$common ${modes[$mode]}" | tail -1
  done
done
"$py" deploy/experiments/straggler_report.py "$out"

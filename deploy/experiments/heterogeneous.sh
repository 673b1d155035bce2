#!/usr/bin/env bash
# Experiment (not a test; about 28 minutes on 2 cores): a cluster whose workers are truly unequal, and what each
# consistency mode makes of it. Every worker runs under a CPU quota of its own (tessera-launch --worker_cpu_quota:
# a control group, so a slow worker computes slower and does not hand its CPU to the others, as a slower device
# would). Default: 4 workers, 2 at 0.6 CPUs and 2 at 0.15 (a quarter of the speed), 1 server. Each model is
# trained to a target test accuracy in six modes:
#   equal     SYNC, every worker batch_size examples a round
#   balanced  SYNC, the round's batch split by each worker's measured throughput (balance: THROUGHPUT)
#   backup    SYNC with as many backup workers as slow workers (a round closes without the last ones)
#   async     ASYNC with the staleness-aware rate
#   dcasgd    the same with delay compensation (DC-ASGD, consistency.delay_compensation: DC_LAMBDA)
#   ssp2      SSP, staleness bound 2
#   ssp8      SSP, staleness bound 8
# for two models: mlp (the built-in worker, batch 256 per worker, to 0.85) and cnn (worker/python/examples/
# fashion_mnist.py as the workers, batch 128 per worker, to 0.85). Then one more run, `throttled`: the MLP
# balanced, every worker at 0.6 CPUs until THROTTLE_AT seconds, when the last worker drops to 0.15 (a device that
# slows down mid-run): the shares must follow.
#
#   deploy/experiments/heterogeneous.sh [OUT_DIR]      # default runs/heterogeneous-<time>
#
# Writes OUT_DIR/table.md and table.csv (time and steps to the target, final accuracy, examples per second and
# share of each worker, staleness median and p99, the balancer's changes and settling round), and per model
# OUT_DIR/<model>.png (test accuracy against seconds; each worker's share over time) and OUT_DIR/throttled.png.
# Needs root (or a delegated cgroup) for the quotas, Debian's python3-matplotlib for the plots, and for the CNN
# the Python package (pybind11-dev) and python3-torch.
# Environment (all optional):
#   MODELS="mlp cnn"  MODES="equal balanced backup async dcasgd ssp2 ssp8"  THROTTLED=1 (0: no throttled run)
#   DC_LAMBDA=100 delay compensation's lambda in the dcasgd runs
#   QUOTAS=0.6,0.6,0.15,0.15   one quota per worker, in CPUs (the number of workers is the number of entries)
#   TARGET=0.85  MAX_SECONDS=300 (each run stops there if the target is not reached)  MAX_STEPS=0 (no limit)
#   THROTTLE_AT=15  MLP_BATCH=1024 (per worker)  EVAL_EVERY (clocks between evaluations; MLP 5, CNN 20)
# Times to the target count from when every worker had finished its first step, to when the evaluating worker
# (rank 0) had finished the step whose values first scored the target (however long the evaluation then took).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
out="${1:-runs/heterogeneous-$(date +%Y%m%d-%H%M%S)}"
py=/usr/bin/python3
"$py" -c "import matplotlib" 2>/dev/null || {
  echo "heterogeneous.sh: the plots need matplotlib: apt-get install python3-matplotlib" >&2
  exit 2
}
quotas="${QUOTAS:-0.6,0.6,0.15,0.15}"
IFS=, read -r -a quota_list <<<"$quotas"
workers=${#quota_list[@]}
# The slow workers: those below the largest quota. Backup workers: as many.
slow=$("$py" -c "import sys; q=[float(x) for x in sys.argv[1].split(',')]; print(sum(x < max(q) for x in q))" "$quotas")
target="${TARGET:-0.85}"
stop="stop { target_accuracy: $target max_seconds: ${MAX_SECONDS:-300} max_steps: ${MAX_STEPS:-0} epochs: 0 }"
mkdir -p "$out"
declare -A job=([mlp]=deploy/jobs/fashion_mnist_mlp_sync.pbtxt [cnn]=deploy/jobs/fashion_mnist_cnn.pbtxt)
declare -A common=(
  [mlp]="cluster { num_workers: $workers num_servers: 1 } batch_size: ${MLP_BATCH:-1024} eval_every_steps: ${EVAL_EVERY:-5} $stop"
  [cnn]="cluster { num_workers: $workers num_servers: 1 } batch_size: 128 eval_every_steps: ${EVAL_EVERY:-20} $stop")
declare -A modes=(
  [equal]="consistency { mode: SYNC balance: EQUAL }"
  [balanced]="consistency { mode: SYNC balance: THROUGHPUT }"
  [backup]="consistency { mode: SYNC backup_workers: $slow }"
  [async]="consistency { mode: ASYNC staleness_aware_lr: true }"
  [dcasgd]="consistency { mode: ASYNC staleness_aware_lr: true delay_compensation: ${DC_LAMBDA:-100} }"
  [ssp2]="consistency { mode: SSP staleness: 2 }"
  [ssp8]="consistency { mode: SSP staleness: 8 }")

# Runs one job; a machine without a writable CPU controller stops the experiment with the launcher's reason
# (exit 77: what tests read as skipped).
launch() {
  local log="$1"
  shift
  if ! "$bin/tessera-launch" --linger_s=0 --overwrite --timeout_s=1800 "$@" >"$log" 2>&1; then
    if grep -q "CPU quotas need" "$log"; then
      grep "CPU quotas need" "$log" >&2
      exit 77
    fi
    tail -5 "$log" >&2
    echo "heterogeneous.sh: a run failed; its output is in $log" >&2
    exit 1
  fi
  grep "^summary:" "$log" || true
}

for model in ${MODELS:-mlp cnn}; do
  command=()
  if [[ $model == cnn ]]; then
    [[ -d "$bin/../python/tessera" ]] || bash deploy/build.sh _tessera
    command=(-- "$py" worker/python/examples/fashion_mnist.py)
  fi
  for mode in ${MODES:-equal balanced backup async dcasgd ssp2 ssp8}; do
    echo "== $model $mode (quotas $quotas)"
    mkdir -p "$out/$model"
    launch "$out/$model/$mode.log" --job="${job[$model]}" --run_dir="$out/$model/$mode" --worker_cpu_quota="$quotas" \
      --job_override="${common[$model]} ${modes[$mode]}" "${command[@]}"
  done
done
if [[ ${THROTTLED:-1} == 1 ]]; then
  # Every worker at the fast quota, then the last one at the slow quota from THROTTLE_AT seconds on.
  fast=$("$py" -c "import sys; print(max(float(x) for x in sys.argv[1].split(',')))" "$quotas")
  low=$("$py" -c "import sys; print(min(float(x) for x in sys.argv[1].split(',')))" "$quotas")
  before=$("$py" -c "import sys; print(','.join([sys.argv[1]] * int(sys.argv[2])))" "$fast" "$workers")
  after=$("$py" -c "import sys; print(','.join([sys.argv[1]] * (int(sys.argv[2]) - 1) + [sys.argv[3]]))" "$fast" "$workers" "$low")
  echo "== throttled: mlp balanced, quotas $before, then $after after ${THROTTLE_AT:-15} s"
  launch "$out/throttled.log" --job="${job[mlp]}" --run_dir="$out/throttled" --worker_cpu_quota="$before" \
    --worker_cpu_quota_at="${THROTTLE_AT:-15}:$after" \
    --job_override="cluster { num_workers: $workers num_servers: 1 } batch_size: 256 eval_every_steps: 10
stop { max_seconds: $(( ${THROTTLE_AT:-15} * 2 + 5 )) target_accuracy: 0 epochs: 0 } ${modes[balanced]}"
fi
"$py" deploy/experiments/heterogeneous_report.py "$out" "$target"

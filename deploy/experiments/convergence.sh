#!/usr/bin/env bash
# Experiment (not a test; about 4 minutes on 2 cores): do ASYNC and SSP(3) converge as well as SYNC? The Quick
# start job switched to 4 workers, batch 32, SGD lr 0.02 with momentum 0.9 and 2 servers is trained to 0.88 test
# accuracy (at most 15 epochs) in each mode; the table gives the epochs each needed and their ratio to SYNC's.
#
#   deploy/experiments/convergence.sh [OUT_DIR] [EXTRA_JOB_OVERRIDE]
#       defaults: runs/convergence-<time>, none. EXTRA_JOB_OVERRIDE (text format, e.g.
#       'consistency { async_momentum: AS_GIVEN }') is merged over every mode's job. MODES="async ssp3" runs
#       a subset (the table reads the other runs from OUT_DIR when they are there).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
out="${1:-runs/convergence-$(date +%Y%m%d-%H%M%S)}"
extra="${2:-}"
mkdir -p "$out"
common='cluster { num_workers: 4 num_servers: 2 } batch_size: 32 optimizer { learning_rate: 0.02 momentum: 0.9 }
stop { target_accuracy: 0.88 epochs: 15 } eval_every_steps: 100'
declare -A modes=([sync]="consistency { mode: SYNC }" [async]="consistency { mode: ASYNC }"
                  [ssp3]="consistency { mode: SSP staleness: 3 }")
for mode in ${MODES:-sync async ssp3}; do
  echo "== $mode"
  "$bin/tessera-launch" --linger_s=0 --overwrite --job=deploy/jobs/fashion_mnist_mlp_sync.pbtxt --run_dir="$out/$mode" \
    --job_override="$common ${modes[$mode]} $extra" | tail -1
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def first_epoch(run):
    with open(os.path.join(out, run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["test_accuracy"] >= 0.88:
                return r["epoch"], r["wall_seconds"]
    return None, None
rows = ["| mode | epochs to 0.88 | ratio to sync | seconds to 0.88 | final accuracy | max staleness |",
        "|---|---|---|---|---|---|"]
base = first_epoch("sync")[0] if os.path.exists(os.path.join(out, "sync")) else None
for run in ["sync", "async", "ssp3"]:
    if not os.path.exists(os.path.join(out, run, "summary.json")):
        continue
    with open(os.path.join(out, run, "summary.json")) as f:
        s = json.load(f)
    e, t = first_epoch(run)
    ratio = "{:.2f}".format(e / base) if e and base else "-"
    rows.append("| {} | {} | {} | {} | {:.4f} | {} |".format(
        run, "{:.2f}".format(e) if e else "not reached", ratio, "{:.1f}".format(t) if t else "-",
        s.get("test_accuracy") or 0, s.get("max_staleness", "-")))
text = "\n".join(rows)
print(text)
open(os.path.join(out, "table.md"), "w").write(text + "\n")
PY

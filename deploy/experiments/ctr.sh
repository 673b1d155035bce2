#!/usr/bin/env bash
# Experiment (not a test): click-through-rate models on embedding tables, against the model their labels were
# drawn from. Two generated tasks (python3 -m tessera.ctr generate: Criteo-shaped, 13 dense and 26 categorical
# fields, power-law ids in spaces of 2^20 to 2^26), each trained in SYNC, ASYNC and SSP(2) with 2 workers and 2
# servers by worker/python/examples/ctr.py:
#   logistic  labels from a planted logistic model; logistic regression (a table of dim 1 over every field)
#   dlrm      labels from a planted factorisation machine; a small DLRM (a factor table of dim 8, pairwise dot
#             products, a top MLP, and a table of dim 1)
# It prints one table (test log loss and AUC at the end against the planted model's, the AUC gap, rows updated
# per second summed over the workers, training seconds) and writes OUT_DIR/table.md, and per task the curves of
# AUC against seconds (OUT_DIR/<task>/accuracy.svg: the job's "accuracy" is the AUC here). About 5 minutes on 2
# cores with the defaults.
#
#   deploy/experiments/ctr.sh [OUT_DIR]
#       default OUT_DIR: runs/ctr-<time>. TRAIN (examples, default 1000000), TEST (20000), EPOCHS (1), TASKS
#       ("logistic dlrm") and MODES ("sync async ssp2") choose a subset or a size; DLRM_FLAGS adds flags of
#       ctr.py to the DLRM's runs (for example --fm_sum). The DLRM within 0.01 AUC of its planted model:
#       TRAIN=8000000 TASKS=dlrm DLRM_FLAGS=--fm_sum gives it the data it needs (README.md here; about 6 minutes
#       of training a mode on 2 cores, the generator holding about 1.2 GB per million examples at its peak).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
out="${1:-runs/ctr-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
[[ -d "$bin/../python/tessera" ]] || bash deploy/build.sh _tessera
export PYTHONPATH="$(cd "$bin/../python" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
declare -A planted=([logistic]=logistic [dlrm]=fm)
declare -A flags=([logistic]="" [dlrm]="${DLRM_FLAGS:-}")
declare -A modes=([sync]="consistency { mode: SYNC }" [async]="consistency { mode: ASYNC }"
                  [ssp2]="consistency { mode: SSP staleness: 2 }")
for task in ${TASKS:-logistic dlrm}; do
  data="$out/$task/data"
  echo "== $task: generating ${TRAIN:-1000000} training and ${TEST:-20000} test examples"
  /usr/bin/python3 -m tessera.ctr generate --out "$data" --train "${TRAIN:-1000000}" --test "${TEST:-20000}" \
    --planted "${planted[$task]}" --seed 1
  runs=()
  for mode in ${MODES:-sync async ssp2}; do
    echo "== $task $mode"
    run="$out/$task/$mode"
    "$bin/tessera-launch" --linger_s=0 --overwrite --timeout_s=3600 --job=deploy/jobs/ctr_logistic.pbtxt \
      --run_dir="$run" --job_override="name: 'ctr-$task' stop { epochs: ${EPOCHS:-1} } ${modes[$mode]}" \
      -- /usr/bin/python3 worker/python/examples/ctr.py --data="$data" --model="$task" --out="$run" \
      --eval_every=250 ${flags[$task]} | tail -1
    runs+=("$run")
  done
  python3 deploy/experiments/plot_runs.py "$out/$task" "${runs[@]}" >/dev/null
done
python3 - "$out" ${TASKS:-logistic dlrm} <<'PY'
import glob, json, os, sys
out, tasks = sys.argv[1], sys.argv[2:]
rows = ["| task | mode | steps | test log loss | planted log loss | test AUC | planted AUC | AUC gap | rows updated/s | training s |",
        "|---|---|---|---|---|---|---|---|---|---|"]
for task in tasks:
    with open(os.path.join(out, task, "data", "planted.json")) as f:
        planted = json.load(f)["test"]
    for mode in ["sync", "async", "ssp2"]:
        files = sorted(glob.glob(os.path.join(out, task, mode, "ctr-rank*.json")))
        if not files:
            continue
        ranks = [json.load(open(p)) for p in files]
        last = next(r for r in ranks if r["rank"] == 0)["curve"][-1]
        rate = sum(r["rows_updated_per_s"] for r in ranks)
        seconds = max(r["seconds"] for r in ranks)
        rows.append(f"| {task} | {mode} | {last['clock']} | {last['log_loss']:.4f} | {planted['log_loss']:.4f} | "
                    f"{last['auc']:.4f} | {planted['auc']:.4f} | {planted['auc'] - last['auc']:.4f} | "
                    f"{rate:,.0f} | {seconds:.1f} |")
table = "\n".join(rows)
print(table)
with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table + "\n")
print("table: " + os.path.join(out, "table.md") + "; curves: " + ", ".join(
    os.path.join(out, t, "accuracy.svg") for t in tasks))
PY

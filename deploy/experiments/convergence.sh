#!/usr/bin/env bash
# Experiment (not a test): do ASYNC and SSP(3) converge as well as SYNC, and SYNC over a bfloat16 wire (gradients
# and values in 16 bits, with error feedback) as well as over float32? Two models, each trained in every mode
# with 4 workers and 2 servers, and one table of the epochs each needed and their ratio to SYNC's:
#   mlp  the built-in worker: the Quick start job with batch 32, SGD lr 0.02 and momentum 0.9, to 0.88 test
#        accuracy (at most 15 epochs); about 4 minutes on 2 cores;
#   cnn  a PyTorch script as the workers (worker/python/examples/fashion_mnist.py, the small CNN): the job
#        deploy/jobs/fashion_mnist_cnn.pbtxt with batch 32 per worker, to 0.90 (at most 10 epochs); about 25
#        minutes on 2 cores. Needs the Python package (pybind11-dev) and Debian's python3-torch.
#   cnn_script  the same script with its own recipe (optimizer { kind: SCRIPT }: AdamW, warmup then cosine,
#        clip_grad_norm_, two micro-batches per step; deploy/jobs/fashion_mnist_cnn_script.pbtxt) with batch 32
#        per worker, to 0.90 (at most 10 epochs). Not in the default MODELS (MODELS="cnn_script" runs it).
#
#   deploy/experiments/convergence.sh [OUT_DIR] [EXTRA_JOB_OVERRIDE]
#       defaults: runs/convergence-<time>, none. EXTRA_JOB_OVERRIDE (text format, e.g.
#       'consistency { async_momentum: AS_GIVEN }') is merged over every run's job. MODELS="cnn" and
#       MODES="async ssp3" run a subset of the modes sync, async, ssp3 and sync_bf16 (the table reads the other
#       runs from OUT_DIR when they are there).
# Runs: OUT_DIR/MODE (the MLP) and OUT_DIR/cnn-MODE; the table also goes to OUT_DIR/table.md.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
out="${1:-runs/convergence-$(date +%Y%m%d-%H%M%S)}"
extra="${2:-}"
mkdir -p "$out"
declare -A job=([mlp]=deploy/jobs/fashion_mnist_mlp_sync.pbtxt [cnn]=deploy/jobs/fashion_mnist_cnn.pbtxt
                 [cnn_script]=deploy/jobs/fashion_mnist_cnn_script.pbtxt)
declare -A common=(
  [mlp]='cluster { num_workers: 4 num_servers: 2 } batch_size: 32 optimizer { learning_rate: 0.02 momentum: 0.9 }
stop { target_accuracy: 0.88 epochs: 15 } eval_every_steps: 100'
  [cnn]='cluster { num_workers: 4 num_servers: 2 } batch_size: 32 stop { target_accuracy: 0.90 epochs: 10 }
eval_every_steps: 200'
  [cnn_script]='cluster { num_workers: 4 num_servers: 2 } batch_size: 32 stop { target_accuracy: 0.90 epochs: 10 }
eval_every_steps: 200')
declare -A prefix=([mlp]="" [cnn]="cnn-" [cnn_script]="cnn_script-")
declare -A modes=([sync]="consistency { mode: SYNC }" [async]="consistency { mode: ASYNC }"
                  [ssp3]="consistency { mode: SSP staleness: 3 }"
                  [sync_bf16]="consistency { mode: SYNC } wire { gradients: BF16 values: BF16 }")
for model in ${MODELS:-mlp cnn}; do
  command=()
  if [[ $model == cnn* ]]; then
    [[ -d "$bin/../python/tessera" ]] || bash deploy/build.sh _tessera
    command=(-- /usr/bin/python3 worker/python/examples/fashion_mnist.py)
    [[ $model == cnn_script ]] && command+=(--micro_batches=2)
  fi
  for mode in ${MODES:-sync async ssp3 sync_bf16}; do
    echo "== $model $mode"
    "$bin/tessera-launch" --linger_s=0 --overwrite --timeout_s=3600 --job="${job[$model]}" \
      --run_dir="$out/${prefix[$model]}$mode" --job_override="${common[$model]} ${modes[$mode]} $extra" \
      "${command[@]}" | tail -1
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
models = [("mlp", "", 0.88), ("cnn", "cnn-", 0.90), ("cnn_script", "cnn_script-", 0.90)]
def records(run):
    with open(os.path.join(out, run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
def first_epoch(run, target):
    for r in records(run):
        if r["test_accuracy"] >= target:
            return r["epoch"], r["wall_seconds"]
    return None, None
def best(run):
    rs = records(run)
    return max(rs, key=lambda r: r["test_accuracy"]) if rs else None
rows = ["| model | mode | target | epochs to target | ratio to sync | seconds to target | final accuracy | max staleness |",
        "|---|---|---|---|---|---|---|---|"]
for model, prefix, target in models:
    base = None
    if os.path.exists(os.path.join(out, prefix + "sync", "metrics.jsonl")):
        base = first_epoch(prefix + "sync", target)[0]
    for mode in ["sync", "async", "ssp3", "sync_bf16"]:
        run = prefix + mode
        if not os.path.exists(os.path.join(out, run, "summary.json")):
            continue
        with open(os.path.join(out, run, "summary.json")) as f:
            s = json.load(f)
        e, t = first_epoch(run, target)
        ratio = "{:.2f}".format(e / base) if e and base else "-"
        top = best(run)
        reached = "{:.2f}".format(e) if e else "not reached (best {:.4f} at epoch {:.2f})".format(
            top["test_accuracy"], top["epoch"]) if top else "not reached"
        rows.append("| {} | {} | {} | {} | {} | {} | {:.4f} | {} |".format(
            model, mode, target, reached, ratio,
            "{:.1f}".format(t) if t else "-", s.get("test_accuracy") or 0, s.get("max_staleness", "-")))
text = "\n".join(rows)
print(text)
open(os.path.join(out, "table.md"), "w").write(text + "\n")
PY

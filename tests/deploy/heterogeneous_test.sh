#!/usr/bin/env bash
# The heterogeneous-cluster experiment (deploy/experiments/heterogeneous.sh), short: the MLP on 4 workers under
# CPU quotas (2 at 0.6 CPUs, 2 at 0.15), SYNC with an equal split and balanced by throughput, a few hundred steps
# at most, to 0.80; then the throttled run (a worker's quota cut after 4 s). Checks that the table has both modes
# with a time to the target and a share per worker, that the balanced run gives the slow workers the smaller
# shares, that the throttled run's shares moved after the cut, and that the plots were drawn.
# Exit status: 0 passed, 1 failed, 77 skipped (no writable CPU controller here: the reason is printed).
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
MODELS=mlp MODES="equal balanced" MLP_BATCH=256 TARGET=0.80 MAX_STEPS=400 MAX_SECONDS=120 THROTTLE_AT=4 \
  bash "$repo/deploy/experiments/heterogeneous.sh" "$out/run"
status=$?
if [[ $status -eq 77 ]]; then
  echo "skipped: the experiment needs CPU quotas (see the reason above)"
  exit 77
fi
[[ $status -eq 0 ]] || { echo "FAIL: heterogeneous.sh exited $status"; exit 1; }
/usr/bin/python3 - "$out/run" <<'PY'
import csv, os, sys
out = sys.argv[1]
rows = {r["mode"]: r for r in csv.DictReader(open(os.path.join(out, "table.csv")))}
failures = []
for mode in ["equal", "balanced"]:
    if mode not in rows:
        failures.append("no row for " + mode)
    elif not rows[mode]["seconds_to_target"]:
        failures.append(mode + " did not reach 0.80")
if "balanced" in rows:
    shares = [float(x) for x in rows["balanced"]["shares"].strip("[]").split(",")]
    if not max(shares[2:]) < min(shares[:2]):
        failures.append("the slow workers (2, 3) do not have the smaller shares: %s" % shares)
table = open(os.path.join(out, "table.md")).read()
if "throttled: at" not in table:
    failures.append("the table says nothing of the throttled run")
elif "first change at round None" in table:
    failures.append("the shares did not move after the throttling: " + table.splitlines()[-1])
for png in ["mlp.png", "throttled.png"]:
    if not os.path.getsize(os.path.join(out, png)) > 10000:
        failures.append(png + " is missing or empty")
print(table)
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY

#!/usr/bin/env bash
# Experiment (not a test; a few minutes): the Quick start job, trained to a fixed step count with a checkpoint
# every 5 s, while a random server is killed (kill -9) every 20 s, a random worker every 30 s and the scheduler
# every 45 s. The launcher starts the killed daemons again (same id or rank; the scheduler on its port); the
# scheduler moves a lost server's chunks, rolls the sync job back to the latest checkpoint, and takes each
# returning daemon back; a restarted scheduler takes the running job back from the servers and workers. Then the same job runs once more
# undisturbed, and the two are compared: the chaos run must finish, with test accuracy within 0.5 points of the
# clean run. Prints every kill, the time lost to it and the updates it lost.
#
#   deploy/experiments/chaos.sh [STEPS] [OUT_DIR] [TRANSPORT] [BACKUPS]   # defaults: 6000, runs/chaos-<time>, grpc, 0
#
# TRANSPORT ucx moves the data plane over UCX (transport: UCX, trusted_network: true) in both runs. BACKUPS 1
# gives every chunk a backup (replication { backups: 1 }): a lost server's chunks go to their backups, with no
# rollback; the job then runs on 3 servers, so that a backup is left after a loss. Every 25 s (from 10 s) a
# random server is also drained (POST /drain?server=N) and a new tessera-server joins in its place.
set -euo pipefail
source "$(dirname "$0")/setup.sh"
steps="${1:-6000}"
out="${2:-runs/chaos-$(date +%Y%m%d-%H%M%S)}"
transport="${3:-grpc}"
backups="${4:-0}"
case "$transport" in
  grpc | ucx) ;;
  *) echo "chaos.sh: TRANSPORT must be grpc or ucx, got '$transport'" >&2; exit 2 ;;
esac
case "$backups" in
  0 | 1) ;;
  *) echo "chaos.sh: BACKUPS must be 0 or 1, got '$backups'" >&2; exit 2 ;;
esac
mkdir -p "$out"

# The Quick start job, to a fixed step count instead of a target accuracy.
sed -e 's/^name: .*/name: "chaos"/' -e "s/^stop .*/stop { max_steps: $steps }/" \
  deploy/jobs/fashion_mnist_mlp_sync.pbtxt >"$out/job.pbtxt"
if [[ $transport == ucx ]]; then
  echo "transport: UCX trusted_network: true" >>"$out/job.pbtxt"
fi
if ((backups > 0)); then
  sed -i -e 's/num_servers: [0-9]*/num_servers: 3/' "$out/job.pbtxt"
  echo "replication { backups: $backups }" >>"$out/job.pbtxt"
fi

now() { date +%s.%N; }
launch_flags=(--job="$out/job.pbtxt" --device=cpu --heartbeat_timeout_ms=2000)

echo "== chaos run: $steps steps over $transport, $backups backups per chunk; a server killed every 20 s, a worker every 30 s, the scheduler every 45 s, a server drained and one joined every 25 s"
: >"$out/kills.tsv"
start=$(now)
"$bin/tessera-launch" --linger_s=0 --overwrite "${launch_flags[@]}" --run_dir="$out/chaos" --checkpoint_every_s=5 \
  --restart_servers=1000 --restart_workers=1000 --restart_scheduler=1000 >"$out/chaos.out" 2>&1 &
launcher=$!
next_server=20
next_worker=30
next_scheduler=45
next_drain=10
joiners=()
while kill -0 "$launcher" 2>/dev/null; do
  sleep 1  # the kill schedule's tick, not a synchronisation point
  elapsed=$(python3 -c "print(int($(now) - $start))")
  if ((elapsed >= next_drain)); then
    next_drain=$((next_drain + 25))
    address=$(grep -o 'scheduler listening on [^ ]*' "$out/chaos.out" | head -1 | awk '{print $4}')
    port=$(grep -o 'dashboard at http://127.0.0.1:[0-9]*' "$out/chaos.out" | tail -1 | sed 's/.*://')  # a restarted scheduler's
    victim=$((RANDOM % 3))
    if [[ -n $address && -n $port ]] &&
      python3 - "$port" "$victim" "$out/chaos/secrets/token" >>"$out/drains.log" 2>&1 <<'PY'; then
import sys, urllib.request
port, server, token = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().strip()
request = urllib.request.Request(f"http://127.0.0.1:{port}/drain?server={server}", data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {token}"})
print(urllib.request.urlopen(request, timeout=120).read().decode(), end="")
PY
      echo "   $(python3 -c "print(round($(now) - $start, 1))") s: drained server $victim; a new server joins"
      "$bin/tessera-server" --scheduler="$address" --token_file="$out/chaos/secrets/token" \
        >>"$out/joined-$victim.log" 2>&1 &
      joiners+=($!)
    fi
  fi
  for role in server worker scheduler; do
    due_var="next_$role"
    if ((elapsed >= ${!due_var})); then
      if [[ $role == server ]]; then
        # The launcher's servers and those that joined (children of this script): every server of the job.
        address=$(grep -o 'scheduler listening on [^ ]*' "$out/chaos.out" | head -1 | awk '{print $4}')
        mapfile -t pids < <(pgrep -f "tessera-server --scheduler=$address" || true)
      else
        mapfile -t pids < <(pgrep -P "$launcher" -f "tessera-$role" || true)
      fi
      if ((${#pids[@]} > 0)); then
        victim=${pids[RANDOM % ${#pids[@]}]}
        name=$(tr '\0' ' ' </proc/"$victim"/cmdline | grep -o -- '--\(id\|rank\)=[0-9]*' || echo "-")
        if kill -9 "$victim" 2>/dev/null; then
          printf '%s\t%s\t%s\n' "$(python3 -c "print(round($(now) - $start, 1))")" "$role" "$name" >>"$out/kills.tsv"
          echo "   $(tail -1 "$out/kills.tsv" | cut -f1) s: killed $role $name (pid $victim)"
        fi
      fi
      case $role in
        server) next_server=$((next_server + 20)) ;;
        worker) next_worker=$((next_worker + 30)) ;;
        scheduler) next_scheduler=$((next_scheduler + 45)) ;;
      esac
    fi
  done
done
status=0
wait "$launcher" || status=$?
for joiner in "${joiners[@]}"; do wait "$joiner" || true; done  # they exit when the job ends
chaos_seconds=$(python3 -c "print(round($(now) - $start, 1))")
tail -3 "$out/chaos.out"
if ((status != 0)); then
  echo "chaos run FAILED (tessera-launch exited $status); see $out/chaos.out and $out/chaos/logs/"
  exit 1
fi

echo "== clean run of the same job"
start=$(now)
"$bin/tessera-launch" --linger_s=0 --overwrite "${launch_flags[@]}" --run_dir="$out/clean" >"$out/clean.out" 2>&1
clean_seconds=$(python3 -c "print(round($(now) - $start, 1))")

python3 - "$out" "$chaos_seconds" "$clean_seconds" <<'EOF'
import json, sys
out, chaos_s, clean_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
chaos = json.load(open(f"{out}/chaos/summary.json"))
clean = json.load(open(f"{out}/clean/summary.json"))
kills = [line.rstrip("\n").split("\t") for line in open(f"{out}/kills.tsv")]
steps_per_s = clean["steps"] / clean["wall_seconds"]
# Kill times count from this script's start, event times from the scheduler's, which starts a little later; a
# restarted server can be recovered within that difference, so an event up to SKEW seconds "before" a kill is
# still its own.
SKEW = 1.0
print(f"\n| run | steps | test accuracy | wall s |\n|---|---|---|---|")
print(f"| clean | {clean['steps']} | {clean['test_accuracy']:.4f} | {clean_s} |")
print(f"| chaos | {chaos['steps']} | {chaos['test_accuracy']:.4f} | {chaos_s} |")
recoveries = [e for e in chaos["events"]
              if e["event"] in ("server lost, recovered", "server lost, backups took over")]
steps_lost = sum(e.get("clocks_lost", 0) for e in recoveries)
drains = [e for e in chaos["events"] if e["event"] == "server drained"]
joins = [e for e in chaos["events"] if e["event"] == "server joined, chunks moved to it"]
rejoins = [e for e in chaos["events"] if e["event"] == "worker rejoined"]
takebacks = [e for e in chaos["events"] if e["event"] == "scheduler restarted, job taken back"]
print(f"\nkills survived: {len(kills)} ({sum(k[1] == 'server' for k in kills)} servers, "
      f"{sum(k[1] == 'worker' for k in kills)} workers, {sum(k[1] == 'scheduler' for k in kills)} schedulers)")
print("\n| kill at s | killed | what it cost |\n|---|---|---|")
for at, role, name in kills:
    at = float(at)
    if role == "server":
        r = next((e for e in recoveries if e["wall_seconds"] >= at - SKEW), None)
        if r is None:
            print(f"| {at} | server {name} | no recovery recorded |")
            continue
        recoveries.remove(r)
        redo = r["clocks_lost"] / steps_per_s
        back = max(0.0, r["wall_seconds"] - at)
        how = ("backups took over, no step lost" if r["event"] == "server lost, backups took over" else
               f"{r['clocks_lost']} steps redone from the checkpoint (~{redo:.1f} s)")
        print(f"| {at} | server {name} | training again {back:.1f} s after the kill; {how}: ~{back + redo:.1f} s lost |")
    elif role == "scheduler":
        r = next((e for e in takebacks if e["wall_seconds"] >= at - SKEW), None)
        if r is not None:
            takebacks.remove(r)
        back = (f"job taken back {max(0.0, r['wall_seconds'] - at):.1f} s after the kill, no rollback" if r
                else "job not taken back")
        print(f"| {at} | the scheduler | {back} |")
    else:
        r = next((e for e in rejoins if e["wall_seconds"] >= at - SKEW), None)
        if r is not None:
            rejoins.remove(r)
        back = f"rejoined {max(0.0, r['wall_seconds'] - at):.1f} s later at clock {r['clock']}" if r else "did not rejoin"
        print(f"| {at} | worker {name} | {back}; the other worker's rounds went on meanwhile |")
if drains or joins:
    print("\n| at s | what | chunks | took s |\n|---|---|---|---|")
    for e in sorted(drains + joins, key=lambda e: e["wall_seconds"]):
        what = f"server {e['server']} drained" if e["event"] == "server drained" else f"a server joined as {e['server']}"
        print(f"| {e['wall_seconds']:.1f} | {what} | {e['chunks_moved']} | {e['seconds']:.3f} |")
gap = abs(chaos["test_accuracy"] - clean["test_accuracy"]) * 100
print(f"\ntest accuracy: chaos {chaos['test_accuracy']:.4f}, clean {clean['test_accuracy']:.4f}: "
      f"{gap:.2f} points apart ({'within' if gap <= 0.5 else 'NOT within'} 0.5); wall time lost overall "
      f"{chaos_s - clean_s:.1f} s")
print(f"updates lost: {steps_lost} steps rolled back to checkpoints")
sys.exit(0 if chaos["completed"] and gap <= 0.5 else 1)
EOF

#!/usr/bin/env bash
# End-to-end test of deploy/slurm/tessera.sbatch and deploy/slurm/tessera-hetjob.sbatch: starts a throwaway
# two-node Slurm cluster on this host (tests/deploy/slurm_cluster.sh), submits both scripts at once with a short
# CPU job (40 clocks of the Fashion-MNIST MLP), the first script also with a PyTorch script as the workers, and
# checks each run's summary.json. Exit 0: pass, 1: fail,
# 77: skipped (no Slurm or munge, or not root).
#
#   tests/deploy/slurm_test.sh            # binaries from ${TESSERA_BUILD_DIR:-build}/bin
#
# Environment: TESSERA_BUILD_DIR, SLURM_TEST_DEADLINE_S (per job, default 240), SLURM_TEST_KEEP=1 keeps the
# temporary folder. Each run has its own folder and ports, so runs may overlap.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { echo "slurm_test: $*"; }
skip() {
  say "SKIP: $*"
  exit 77
}

for c in slurmctld slurmd munged sbatch squeue scontrol ss; do
  command -v "$c" >/dev/null || skip "$c is not installed (Debian: apt-get install slurm-wlm munge)"
done
[[ $(id -u) -eq 0 ]] || skip "needs root: the test cluster runs slurmctld, slurmd and the jobs as root"

build=${TESSERA_BUILD_DIR:-build}
[[ $build == /* ]] || build=$repo/$build
bin=$build/bin
for b in tessera-scheduler tessera-server tessera-worker; do
  [[ -x $bin/$b ]] || {
    say "FAIL: $bin/$b not found (build first, or set TESSERA_BUILD_DIR)"
    exit 1
  }
done
deadline_s=${SLURM_TEST_DEADLINE_S:-240}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-slurm-test.XXXXXX")
cleanup() {
  "$here/slurm_cluster.sh" stop "$tmp/cluster" || true
  if [[ ${SLURM_TEST_KEEP:-0} == 1 ]]; then say "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Node names that resolve to this host (127.0.0.2 is loopback on Linux), so that the daemons can dial the
# scheduler at the first host of SLURM_JOB_NODELIST ("127.0.0.[1-2]") as on a real cluster.
start_s=$SECONDS
SLURM_CLUSTER_NODES="127.0.0.1 127.0.0.2" "$here/slurm_cluster.sh" start "$tmp/cluster" >/dev/null
export SLURM_CONF=$tmp/cluster/slurm.conf
say "cluster up in $((SECONDS - start_s)) s: $(sinfo -h -o '%D nodes %t %N, %c CPUs each' | head -n1)"

# The schedulers' ports: free now, different from each other.
taken=" "
free_port() {
  local p listening
  listening=" $(ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u | tr '\n' ' ') "
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 30000))
    if [[ $listening != *" $p "* && $taken != *" $p "* ]]; then
      taken+="$p "
      printf -v "$1" %s "$p"
      return 0
    fi
  done
  say "FAIL: no free port"
  exit 1
}
plain_port="" het_port="" python_port=""
free_port plain_port
free_port het_port
free_port python_port

# A short job: the Fashion-MNIST MLP for 40 clocks, no accuracy target.
cat >"$tmp/job.pbtxt" <<'EOF'
name: "slurm-test"
model { mlp { hidden_sizes: [256, 128] } }
data { format: IDX }
optimizer { kind: SGD learning_rate: 0.05 momentum: 0.9 }
batch_size: 64
consistency { mode: SYNC }
stop { max_steps: 40 }
eval_every_steps: 20
seed: 42
EOF

# TLS for the heterogeneous job (the plain one runs with TESSERA_INSECURE=true): a CA and one certificate that
# names both nodes, as a site would issue for its nodes.
het_security=(TESSERA_INSECURE=true)
if command -v openssl >/dev/null; then
  (
    umask 077
    mkdir -p "$tmp/tls"
    cd "$tmp/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
      -days 2 -subj "/CN=slurm test CA" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout node.key -out node.csr \
      -subj "/CN=slurm test node"
    printf '%s\n' "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost" \
      "extendedKeyUsage=serverAuth,clientAuth" "basicConstraints=CA:FALSE" >node.ext
    openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 2 \
      -extfile node.ext
  ) >"$tmp/openssl.log" 2>&1 || {
    say "FAIL: could not make test certificates:"
    cat "$tmp/openssl.log"
    exit 1
  }
  het_security=(TESSERA_TLS_CERT="$tmp/tls/node.pem" TESSERA_TLS_KEY="$tmp/tls/node.key"
    TESSERA_TLS_CA="$tmp/tls/ca.pem")
fi

# submit NAME SCRIPT PORT [VAR=VALUE...] [-- WORKER COMMAND]: sbatch --wait in the background; its status lands
# in NAME.rc.
submit() {
  local name=$1 script=$2 port=$3 settings=() command=()
  shift 3
  while (($# > 0)) && [[ $1 != -- ]]; do
    settings+=("$1")
    shift
  done
  (($# == 0)) || command=("${@:2}")
  (
    rc=0
    env TESSERA_BIN="$bin" TESSERA_JOB="$tmp/job.pbtxt" TESSERA_RUN_DIR="$tmp/$name" \
      TESSERA_SCHEDULER_PORT="$port" TESSERA_STOP_GRACE_S=10 "${settings[@]}" \
      timeout "$deadline_s" sbatch --wait --chdir="$tmp" --job-name="tessera-$name" --output="$tmp/$name.out" \
      "$repo/deploy/slurm/$script" "${command[@]}" >"$tmp/$name.sbatch" 2>&1 || rc=$?
    echo "$rc" >"$tmp/$name.rc"
  ) &
}

# check NAME WORKERS: the job's status and its summary.json.
failed=0
check() {
  local name=$1 workers=$2 rc summary problem=""
  summary=$tmp/$name/summary.json
  rc=$(cat "$tmp/$name.rc" 2>/dev/null || echo "?")
  if [[ $rc == 124 ]]; then
    problem="not finished after ${deadline_s}s"
  elif [[ $rc != 0 ]]; then
    problem="sbatch --wait exited with $rc"
  elif [[ ! -s $summary ]]; then
    problem="no $summary"
  else
    local w s r
    w=$(sed -n 's/^  "workers": \([0-9]*\),\{0,1\}$/\1/p' "$summary")
    s=$(sed -n 's/^  "steps": \([0-9]*\),\{0,1\}$/\1/p' "$summary")
    r=$(sed -n 's/^  "stop_reason": "\(.*\)",\{0,1\}$/\1/p' "$summary")
    if [[ $w != "$workers" ]]; then
      problem="summary says ${w:-no} workers, expected $workers"
    elif [[ $s != 40 ]]; then
      problem="summary says ${s:-no} steps, expected 40"
    elif [[ -z $r ]]; then
      problem="summary has no stop_reason"
    else
      say "$name: ok: $w workers, $s steps, stop_reason \"$r\""
      return 0
    fi
  fi
  say "$name: FAIL: $problem"
  failed=1
  local f
  for f in "$tmp/$name.sbatch" "$tmp/$name.out" "$tmp/$name"/*.log; do
    [[ -f $f ]] || continue
    echo "----- ${f#"$tmp"/} (last 40 lines)"
    tail -n 40 "$f"
  done
}

start_s=$SECONDS
# 2 nodes x 1 task: 2 workers, 2 servers. Heterogeneous: 1 worker on each component's node, 1 server.
submit plain tessera.sbatch "$plain_port" TESSERA_INSECURE=true TESSERA_DEVICE=cpu
submit het tessera-hetjob.sbatch "$het_port" "${het_security[@]}" TESSERA_DEVICE_0=cpu TESSERA_DEVICE_1=cpu
# The workers as a PyTorch script (the built-in MLP's shape), when the build has the Python package and Debian's
# python3-torch is installed.
python_job=0
if [[ -d $build/python/tessera ]] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
  python_job=1
  submit python tessera.sbatch "$python_port" TESSERA_INSECURE=true TESSERA_DEVICE=cpu -- \
    /usr/bin/python3 "$repo/worker/python/examples/fashion_mnist.py" --model=mlp
else
  say "no Python package or no python3-torch in this build: the PyTorch script's job is left out"
fi
wait
say "the jobs ended after $((SECONDS - start_s)) s"
check plain 2
check het 2
((python_job == 0)) || check python 2
if ((failed)); then
  echo "----- squeue"
  squeue 2>&1 || true
  echo "----- slurmctld.log (last 20 lines)"
  tail -n 20 "$tmp/cluster/slurmctld.log" || true
  exit 1
fi
say "PASS (heterogeneous job over $([[ ${het_security[0]} == TESSERA_INSECURE=true ]] && echo plaintext || echo TLS))"

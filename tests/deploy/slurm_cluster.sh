#!/usr/bin/env bash
# A throwaway Slurm cluster on this host, for tests: munged, slurmctld and two slurmd daemons (logical nodes n1
# and n2, both 127.0.0.1), every file of theirs in one folder, every port free at start time.
#
#   tests/deploy/slurm_cluster.sh start DIR   # prints "export SLURM_CONF=DIR/slurm.conf" when the nodes are idle
#   tests/deploy/slurm_cluster.sh stop DIR    # stops every daemon by its pid file
#
# Needs Debian's slurm-wlm and munge, and root (SlurmUser=root). Two nodes rather than one because a
# heterogeneous job never starts on a single Slurm node. Several clusters may run side by side, each with its
# own DIR. Environment: SLURM_CLUSTER_CPUS (CPUs per node, default: what slurmd -C reports, at least 2),
# SLURM_CLUSTER_TIMEOUT_S (how long to wait for the nodes, default 60), SLURM_CLUSTER_NODES (the two node names,
# default "n1 n2"; names that resolve to this host, e.g. "localhost $(hostname)", let programs dial a node by
# the name Slurm gives it).
set -euo pipefail

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}
(($# == 2)) || usage
cmd=$1
dir=$2

# free_port VAR: sets VAR to a TCP port nobody listens on and not handed out before (not a subshell, so that
# $taken is kept). Random, so that clusters started together rarely collide.
taken=" "
free_port() {
  local p listening
  listening=$(ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u | tr '\n' ' ')
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 30000))
    if [[ " $listening " != *" $p "* && "$taken" != *" $p "* ]]; then
      taken+="$p "
      printf -v "$1" %s "$p"
      return 0
    fi
  done
  echo "slurm_cluster: no free port found" >&2
  return 1
}

# stop_pidfiles FILE...: SIGTERM to every live pid named in the files, together; SIGKILL to those alive 10 s on.
stop_pidfiles() {
  local f pid pids=()
  for f in "$@"; do
    [[ -s $f ]] || continue
    pid=$(cat "$f")
    if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local alive
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        alive=1
        break
      fi
    done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$@"
}

stop() {
  # Jobs first (killing slurmd leaves its steps' processes behind), then the daemons, munged last.
  if [[ -s $dir/slurmctld.pid && -f $dir/slurm.conf ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    export SLURM_CONF=$dir/slurm.conf
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
    if [[ -n ${jobs// /} ]]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 100); do
        [[ -z $(squeue -h -o %i 2>/dev/null || true) ]] && break
        sleep 0.2
      done
    fi
  fi
  shopt -s nullglob
  stop_pidfiles "$dir"/slurmd-*.pid "$dir/slurmctld.pid"
  stop_pidfiles "$dir/munged.pid"
}

start() {
  local d
  for d in slurmctld munged slurmd sinfo; do
    command -v "$d" >/dev/null || { echo "slurm_cluster: $d not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  chmod 700 "$dir"
  mkdir -p "$dir/state" "$dir/munge"
  chmod 700 "$dir/munge"

  # munged refuses a key or folder others can read or write.
  mungekey --create --keyfile="$dir/munge/munge.key" --force 2>/dev/null ||
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" --force

  local cpus ctld_port="" n1_port="" n2_port="" n1 n2
  read -r n1 n2 <<<"${SLURM_CLUSTER_NODES:-n1 n2}"
  [[ -n $n1 && -n $n2 && $n1 != "$n2" ]] || { echo "slurm_cluster: SLURM_CLUSTER_NODES needs two names" >&2; exit 2; }
  echo "$n1 $n2" >"$dir/nodes"
  mkdir -p "$dir/spool-$n1" "$dir/spool-$n2"
  cpus=${SLURM_CLUSTER_CPUS:-$(slurmd -C 2>/dev/null | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' | head -1)}
  cpus=${cpus:-2}
  ((cpus >= 2)) || cpus=2
  free_port ctld_port
  free_port n1_port
  free_port n2_port
  cat >"$dir/slurm.conf" <<EOF
# Written by tests/deploy/slurm_cluster.sh
ClusterName=tessera-test
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$n1 NodeAddr=127.0.0.1 Port=$n1_port CPUs=$cpus State=UNKNOWN
NodeName=$n2 NodeAddr=127.0.0.1 Port=$n2_port CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$n1,$n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i
  slurmd -N "$n1"
  slurmd -N "$n2"

  local timeout=${SLURM_CLUSTER_TIMEOUT_S:-60} start_s=$SECONDS states
  while :; do
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    if [[ " $states" == *" $n1 idle "* && " $states" == *" $n2 idle "* ]]; then
      break
    fi
    if ((SECONDS - start_s > timeout)); then
      echo "slurm_cluster: nodes not idle after ${timeout}s (sinfo: ${states:-nothing}); logs in $dir" >&2
      tail -n 20 "$dir"/*.log >&2 || true
      stop
      exit 1
    fi
    sleep 0.2
  done
  echo "export SLURM_CONF=$dir/slurm.conf"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac

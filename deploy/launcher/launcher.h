// The local launcher: a whole Tessera cluster on one machine, each role its own process.
//
// It starts the scheduler, then the servers and workers (worker i asks for rank i; a worker is tessera-worker, or
// the user's command given after "--") pointed at the address the scheduler printed, forwards the scheduler's progress lines, and keeps every other daemon's output in
// <run_dir>/logs/. The scheduler decides the job's fate, as it does for daemons started by hand: a server or
// worker that fails is reported (and a worker started again while it has restarts left; one that exits before its
// rank joined the job, with none left, can never join, and the launcher ends the run at once naming each such
// worker's error; once every worker has exited, the scheduler gets twice its heartbeat timeout and 5 s to end the
// job), and the launcher returns when the scheduler has exited and the others with it: OK when the scheduler says the job completed,
// its reason otherwise. On SIGINT/SIGTERM it asks the scheduler to stop the job gracefully and waits for it; a
// second signal, or the timeout when one is set, stops all children (SIGTERM, then SIGKILL after a grace period).
// Every run ends with a summary.json with a stop_reason: the scheduler's, or the launcher's when the scheduler
// could not write one.
// Children also die with the launcher (PR_SET_PDEATHSIG), so no daemon outlives it and no port stays bound.
#ifndef TESSERA_DEPLOY_LAUNCHER_LAUNCHER_H_
#define TESSERA_DEPLOY_LAUNCHER_LAUNCHER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/rpc/security.h"
#include "deploy/launcher/cpu_quota.h"
#include "worker/straggler.h"

namespace tessera {

struct LaunchOptions {
  std::string bin_dir;       // where tessera-scheduler, -server and -worker are
  std::string job_path;      // the job file handed to the scheduler
  std::string run_dir;       // created; gets logs/, metrics.jsonl, summary.json
  int servers = 0;           // 0: the job's cluster.num_servers
  int workers = 0;           // 0: the job's cluster.num_workers
  std::string device = "auto";
  std::vector<std::string> worker_devices;  // when set, worker i gets worker_devices[i] (a mixed-device job)
  // When set, worker i runs under a CPU quota of worker_cpu_quota[i % size] CPUs (0: none) from the moment it
  // finished its first step, in a control group of its own (deploy/launcher/cpu_quota.h): a slower device made real. Each
  // change sets the quotas anew, that many seconds after the workers started; RUN_DIR/cpu_quotas.jsonl records
  // every quota set.
  std::vector<double> worker_cpu_quota;
  std::vector<CpuQuotaChange> worker_cpu_quota_changes;
  int slow_worker = -1;      // this worker gets `slow` (experiments: a fixed delay, or compute stretched by sleeping)
  StragglerOptions slow;     // its delay, slow factor and the step they start at
  StragglerOptions stalls;   // every worker: transient stalls (experiments)
  int simulate_compute_ms = 0;  // every worker gets --simulate_compute_ms (benchmarks)
  std::string dump_params;   // handed to the workers; rank 0 writes its final parameters there
  // When set, the workers are this command (e.g. {"python3", "train.py", "--lr=0.1"}), run once per worker in
  // the manner of torchrun, instead of tessera-worker. Each gets its settings in its environment:
  // TESSERA_SCHEDULER, TESSERA_RANK, TESSERA_DEVICE, the credentials' TESSERA_TOKEN_FILE and TESSERA_TLS_*, and
  // the build's Python package on PYTHONPATH (tessera.connect() reads them).
  std::vector<std::string> worker_command;
  int timeout_s = 0;         // stop everything after this long; 0: no limit
  int linger_s = 60;         // the scheduler's --linger_s: its dashboard stays up this long after the job
  int restart_workers = 0;   // start a failed worker again, at most this many times per worker
  int restart_servers = 0;   // start a failed server again, at most this many times per server
  int restart_scheduler = 0; // start a scheduler that died again (same port), at most this many times
  int heartbeat_timeout_ms = 0;  // the scheduler's failure detection; 0: its default
  double server_row_memory_mb = 0;  // MiB, fractions allowed: each server's --max_row_memory_mb (embedding tables' rows); 0: no cap
  std::string resume_dir;    // the scheduler goes on from the newest usable checkpoint here; logs are appended to
  // Credentials. Empty: the launcher makes a fresh token for the run (<run_dir>/secrets/token), and with `tls`
  // a fresh CA and certificate too (mutual TLS between every daemon). Given: used as they are.
  SecurityOptions security;
  bool tls = false;
};

// Runs the cluster to completion. OK when the scheduler says the job completed; otherwise why it did not.
// `stopped_by_signal`, when given, gets the signal that asked the job to stop (0: none).
[[nodiscard]] absl::Status RunLocalCluster(const LaunchOptions& options, int* stopped_by_signal = nullptr);

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCHER_LAUNCHER_H_

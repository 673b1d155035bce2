// Everything a worker is configured with, read once from flags (worker_main.cc) or set by tests.
#ifndef TESSERA_WORKER_WORKER_OPTIONS_H_
#define TESSERA_WORKER_WORKER_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "common/rpc/security.h"
#include "worker/training_run.h"

namespace tessera {

struct WorkerOptions {
  std::string scheduler_address;  // HOST:PORT; required unless local
  bool local = false;             // train the job alone, with no servers (the baseline)
  std::string job_path;           // local mode only: the JobSpec file
  std::string run_dir;            // local mode only: metrics.jsonl and summary.json
  std::string device = "auto";    // auto | cpu | cuda:N
  int rank = -1;                  // the rank to take, kept across restarts; -1: the first free one
  int cpu_threads = 1;            // BLAS threads of the CPU backend
  int local_device_index = 0;     // --device=auto: which of the visible GPUs (SLURM_LOCALID)
  std::string listen_host = "127.0.0.1";  // where /healthz and /metrics listen
  int http_port = 0;              // 0: a free port; -1: off
  SecurityOptions security;       // TLS files and the job token (common/rpc/security.h)
  int connect_timeout_s = 120;    // how long to wait for the scheduler at start-up
  int clock_wait_timeout_ms = 300000;
  std::string transport;          // the chunk calls' transport: "" the job's, or "grpc" / "ucx" to override it
  int fabric_spin_us = -1;        // UCX polling after events (PsClient::Options); -1: automatic
  bool fabric_tcp = false;        // UCX may use TCP (PsClient::Options)
  TrainerOptions trainer;
};

// INVALID_ARGUMENT naming the flag at fault.
[[nodiscard]] absl::Status ValidateWorkerOptions(const WorkerOptions& options);

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_OPTIONS_H_

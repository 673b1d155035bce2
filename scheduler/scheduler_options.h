// Everything the scheduler is configured with, read once from flags (scheduler_main.cc) or set by tests.
#ifndef TESSERA_SCHEDULER_SCHEDULER_OPTIONS_H_
#define TESSERA_SCHEDULER_SCHEDULER_OPTIONS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"
#include "proto/job.pb.h"

namespace tessera {

struct SchedulerOptions {
  tessera::v1::JobSpec job;              // validated; see LoadSchedulerJob
  std::string listen_host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                          // 0: any free port
  std::string address_file;              // when set, HOST:PORT is written here once listening
  std::string run_dir;                   // metrics.jsonl and summary.json; empty: none
  int heartbeat_interval_ms = 500;
  int heartbeat_timeout_ms = 10000;      // a worker silent this long is lost
  int http_port = 0;                     // /healthz, /metrics, /status on listen_host; 0: a free port; -1: off
  std::string resume_dir;                // go on from the newest usable checkpoint in this folder; empty: a new job
  // run_dir holds a run that never ended (this scheduler restarted): its records are added to, and its members
  // get a heartbeat timeout to come back before anyone may register afresh.
  bool interrupted_run = false;
  int linger_s = 0;                      // after the job ends, keep serving /status, the dashboard and /metrics
  int stop_grace_ms = 10000;             // on Stop(), how long workers get to finish their step and report
  std::shared_ptr<const Security> security = Security::Plaintext();  // TLS and the job token (common/rpc/security.h)
};

// INVALID_ARGUMENT naming the flag at fault (ports, intervals, the grace periods).
[[nodiscard]] absl::Status ValidateSchedulerOptions(const SchedulerOptions& options);

// Loads the job file and applies the overrides (cluster sizes: 0 keeps the file's value; checkpoint folder:
// empty keeps it), then validates.
[[nodiscard]] absl::StatusOr<tessera::v1::JobSpec> LoadSchedulerJob(const std::string& job_path, int num_servers,
                                                                    int num_workers,
                                                                    const std::string& checkpoint_dir = "");

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_SCHEDULER_OPTIONS_H_

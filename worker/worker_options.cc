#include "worker/worker_options.h"

#include "absl/strings/str_cat.h"
#include "common/daemon/command_line.h"
#include "common/fabric/ucx_worker.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "worker/backend/backend.h"

namespace tessera {

absl::Status ValidateWorkerOptions(const WorkerOptions& options) {
  if (options.local) {
    if (options.job_path.empty()) return absl::InvalidArgumentError("--local needs --job=FILE");
    if (!options.scheduler_address.empty()) {
      return absl::InvalidArgumentError("--local and --scheduler contradict each other; pick one");
    }
  } else {
    if (options.scheduler_address.empty()) {
      return absl::InvalidArgumentError("--scheduler=HOST:PORT is required (or --local --job=FILE)");
    }
    if (!options.job_path.empty()) {
      return absl::InvalidArgumentError("--job is for --local only; a cluster worker gets its job from the scheduler");
    }
    std::string host;
    int port = 0;
    if (absl::Status s = SplitHostPort(options.scheduler_address, &host, &port); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--scheduler: ", s.message()));
    }
  }
  if (absl::Status s = CheckPortOption("--http_port", options.http_port, /*off_allowed=*/true); !s.ok()) return s;
  if (absl::Status s = CheckSpinOption(options.fabric_spin_us); !s.ok()) return s;
  if (options.rank < -1) {
    return absl::InvalidArgumentError(absl::StrCat("--rank: expected >= 0, or -1 (any), got ", options.rank));
  }
  if (options.cpu_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--cpu_threads: expected >= 1, got ", options.cpu_threads));
  }
  if (options.clock_wait_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--clock_wait_timeout_ms: expected >= 1, got ", options.clock_wait_timeout_ms));
  }
  TESSERA_RETURN_IF_ERROR(ParseDevice(options.device).status());
  if (options.connect_timeout_s < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--connect_timeout_s: expected >= 1, got ", options.connect_timeout_s));
  }
  TESSERA_RETURN_IF_ERROR(options.trainer.straggler.Validate());
  if (options.trainer.simulate_compute_ms < 0) {
    return absl::InvalidArgumentError("--simulate_compute_ms: expected >= 0");
  }
  return absl::OkStatus();
}

}  // namespace tessera

#include "scheduler/scheduler_options.h"

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/daemon/command_line.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "scheduler/recovery/checkpointer.h"

namespace tessera {

absl::Status ValidateSchedulerOptions(const SchedulerOptions& options) {
  TESSERA_RETURN_IF_ERROR(CheckPortOption("--port", options.port, /*off_allowed=*/false));
  TESSERA_RETURN_IF_ERROR(CheckPortOption("--http_port", options.http_port, /*off_allowed=*/true));
  if (options.heartbeat_interval_ms < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval_ms: expected >= 1, got ", options.heartbeat_interval_ms));
  }
  if (options.heartbeat_timeout_ms <= options.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat_timeout_ms: expected more than --heartbeat_interval_ms (",
                                                   options.heartbeat_interval_ms, "), got ",
                                                   options.heartbeat_timeout_ms));
  }
  if (options.linger_s < 0) return absl::InvalidArgumentError(absl::StrCat("--linger_s: expected >= 0, got ", options.linger_s));
  if (options.stop_grace_ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--stop_grace_ms: expected >= 0, got ", options.stop_grace_ms));
  }
  return absl::OkStatus();
}

absl::StatusOr<tessera::v1::JobSpec> LoadSchedulerJob(const std::string& job_path, int num_servers,
                                                      int num_workers, const std::string& checkpoint_dir) {
  if (job_path.empty()) return absl::InvalidArgumentError("--job=FILE is required");
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::JobSpec job, LoadJobSpec(job_path));
  if (num_servers > 0) job.mutable_cluster()->set_num_servers(num_servers);
  if (num_workers > 0) job.mutable_cluster()->set_num_workers(num_workers);
  if (!checkpoint_dir.empty()) job.mutable_checkpoint()->set_dir(checkpoint_dir);
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  // A folder every checkpoint would fail in is refused now, not found out at the first checkpoint.
  if (!job.checkpoint().dir().empty()) TESSERA_RETURN_IF_ERROR(Checkpointer::CheckFolder(job.checkpoint().dir()));
  return job;
}

}  // namespace tessera

#include "scheduler/scheduler_options.h"

#include "common/job_spec.h"
#include "common/status_macros.h"

namespace tessera {

absl::StatusOr<tessera::v1::JobSpec> LoadSchedulerJob(const std::string& job_path, int num_servers,
                                                      int num_workers, const std::string& checkpoint_dir) {
  if (job_path.empty()) return absl::InvalidArgumentError("--job=FILE is required");
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::JobSpec job, LoadJobSpec(job_path));
  if (num_servers > 0) job.mutable_cluster()->set_num_servers(num_servers);
  if (num_workers > 0) job.mutable_cluster()->set_num_workers(num_workers);
  if (!checkpoint_dir.empty()) job.mutable_checkpoint()->set_dir(checkpoint_dir);
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  return job;
}

}  // namespace tessera

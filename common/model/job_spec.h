// Reading, defaulting and validating a JobSpec (proto/job.proto).
//
//   absl::StatusOr<tessera::v1::JobSpec> job = tessera::LoadJobSpec("deploy/jobs/fashion_mnist_mlp_sync.pbtxt");
//   if (!job.ok()) { LOG(ERROR) << job.status(); }  // the message names the line or the field at fault
//
// Defaults filled in by ApplyJobDefaults (a field left at zero takes them):
//   data: IDX files of Debian's dataset-fashion-mnist; optimizer: SGD, learning rate 0.05 (SGD) or 0.001 (Adam),
//   Adam betas 0.9/0.999, epsilon 1e-8; batch_size 64; consistency SYNC; eval_every_steps 100;
//   chunk_bytes 65536; cluster 1 server, 1 worker.
#ifndef TESSERA_COMMON_MODEL_JOB_SPEC_H_
#define TESSERA_COMMON_MODEL_JOB_SPEC_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace tessera {

// Where Debian's dataset-fashion-mnist package installs the data set.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist";

// Parses protobuf text format, or JSON when the text starts with '{'. INVALID_ARGUMENT naming the line and
// column on a syntax error or an unknown field. `origin` (a file name) prefixes messages.
[[nodiscard]] absl::StatusOr<tessera::v1::JobSpec> ParseJobSpec(std::string_view text, std::string_view origin);

// Merges job fields in text format over `job` (e.g. "cluster { num_workers: 4 } optimizer { momentum: 0.5 }"):
// a field named replaces the job's value (a zero too: "stop { target_accuracy: 0 }" removes a target), a
// repeated field is replaced as a whole; a message may be named more than once (its fields add up). INVALID_ARGUMENT naming the
// line and column on a syntax error or an unknown field; `job` is unchanged then.
[[nodiscard]] absl::Status MergeJobOverrides(std::string_view text, tessera::v1::JobSpec& job);

// Reads `path`, parses it, fills defaults and validates. NOT_FOUND when the file cannot be read.
[[nodiscard]] absl::StatusOr<tessera::v1::JobSpec> LoadJobSpec(const std::string& path);

// Fills every unset field that has a default (see the file comment).
void ApplyJobDefaults(tessera::v1::JobSpec& job);

// INVALID_ARGUMENT naming the field (e.g. "consistency.staleness") on a value out of range or on fields that
// contradict each other. Call after ApplyJobDefaults.
[[nodiscard]] absl::Status ValidateJobSpec(const tessera::v1::JobSpec& job);

// The job's stop rules (stop { ... }), for everyone who applies them: the workers, the scheduler and the local
// baseline. The clock training ends at by max_steps or epochs (the smaller; INT64_MAX when neither is set),
// with `steps_per_epoch` steps per epoch.
int64_t StopClock(const tessera::v1::JobSpec& job, int64_t steps_per_epoch);
// With a target accuracy that `accuracy` reaches, the job's stop reason ("test accuracy 0.853 reached the
// target 0.85"); empty otherwise.
std::string TargetReachedReason(const tessera::v1::JobSpec& job, double accuracy);

// What the job's model asks every worker to allocate, with `inputs` features and `classes` classes (0: not
// known yet, as for IDX data before the worker reads it), within common/model/wire_limits.h: INVALID_ARGUMENT naming
// the field otherwise. ValidateJobSpec calls it with what the job says; a worker again with its data's sizes.
[[nodiscard]] absl::Status CheckModelSize(const tessera::v1::JobSpec& job, int64_t inputs, int64_t classes);

// "sync", "async" or "ssp(3)".
std::string ModeName(const tessera::v1::ConsistencySpec& consistency);

// The text format of `job`, for logs and for handing a job file on.
std::string JobSpecToText(const tessera::v1::JobSpec& job);

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_JOB_SPEC_H_

// Fuzzes the job-file parser and validator: text format and JSON, then defaults and validation, as the
// scheduler reads --job. Nothing may crash, and a job that validates must print and parse back to itself.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/model/job_spec.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::v1::JobSpec> job = tessera::ParseJobSpec(text, "fuzz");
  if (!job.ok()) return 0;
  (void)tessera::MergeJobOverrides(text, *job);
  tessera::ApplyJobDefaults(*job);
  if (!tessera::ValidateJobSpec(*job).ok()) return 0;
  absl::StatusOr<tessera::v1::JobSpec> again = tessera::ParseJobSpec(tessera::JobSpecToText(*job), "printed");
  if (!again.ok() || !google::protobuf::util::MessageDifferencer::Equals(*again, *job)) __builtin_trap();
  return 0;
}

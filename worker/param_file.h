// A flat file of named float32 tensors, for handing final parameters between a run and a comparison.
// Layout: for each tensor, u32 name length, name bytes, u64 element count, little-endian float32 values.
#ifndef TESSERA_WORKER_PARAM_FILE_H_
#define TESSERA_WORKER_PARAM_FILE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

using NamedTensors = std::map<std::string, std::vector<float>>;

// Written to a temporary name, then renamed.
[[nodiscard]] absl::Status WriteParamFile(const std::string& path, const NamedTensors& tensors);
[[nodiscard]] absl::StatusOr<NamedTensors> ReadParamFile(const std::string& path);

// ||a - b|| / ||b|| over all tensors (NaN when any value is NaN); INVALID_ARGUMENT when names or sizes differ.
[[nodiscard]] absl::StatusOr<double> RelativeError(const NamedTensors& a, const NamedTensors& b);

}  // namespace tessera

#endif  // TESSERA_WORKER_PARAM_FILE_H_

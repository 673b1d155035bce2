// Labelled examples in memory: Fashion-MNIST from gzip'd IDX files, or a seeded synthetic problem.
#ifndef TESSERA_WORKER_DATA_DATASET_H_
#define TESSERA_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/job.pb.h"

namespace tessera {

// Row-major features in [0, 1] (IDX) or N(0, 1)-ish (synthetic), labels in [0, classes). Thread-compatible.
struct Dataset {
  int features = 0;
  int classes = 0;
  std::vector<float> x;
  std::vector<int32_t> y;

  int64_t size() const { return static_cast<int64_t>(y.size()); }
  absl::Span<const float> Example(int64_t i) const { return absl::MakeConstSpan(x).subspan(i * features, features); }
};

// Reads an images file (IDX magic 2051) and a labels file (2049), gzip'd or not; pixels scaled to [0, 1].
// NOT_FOUND when a file is missing; the message names the file and, for the default location, the Debian
// package that provides it. INVALID_ARGUMENT for a malformed file or mismatched counts.
[[nodiscard]] absl::StatusOr<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path);

// The training or test split the job's DataSpec describes.
[[nodiscard]] absl::StatusOr<Dataset> LoadSplit(const tessera::v1::DataSpec& spec, bool train, uint64_t seed);

// A linearly separable-ish problem: `classes` Gaussian clusters in `features` dimensions. The same seed gives the
// same cluster centres for both splits; `train` picks the split's own sample stream.
Dataset MakeSynthetic(int64_t examples, int features, int classes, uint64_t seed, bool train);

}  // namespace tessera

#endif  // TESSERA_WORKER_DATA_DATASET_H_

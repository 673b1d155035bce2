// A histogram of update staleness (in clocks), merged across servers for a run's report.
#ifndef TESSERA_COMMON_MODEL_STALENESS_HISTOGRAM_H_
#define TESSERA_COMMON_MODEL_STALENESS_HISTOGRAM_H_

#include <cstdint>
#include <vector>

#include "nlohmann/json.hpp"
#include "proto/cluster.pb.h"

namespace tessera {

// Counts of staleness 0 .. kBuckets-2 exactly; the last bucket holds everything larger. Not thread-safe.
class StalenessHistogram {
 public:
  static constexpr int kBuckets = 65;

  void Add(int64_t staleness);
  void Merge(const tessera::v1::StalenessHistogram& other);
  tessera::v1::StalenessHistogram ToProto() const;

  int64_t max() const { return max_; }
  int64_t count() const { return count_; }
  // The smallest staleness s with at least q of the updates at or below s (q in [0, 1]); kBuckets - 1 (64)
  // when that is in the last bucket, i.e. "64 or more". 0 when empty.
  int64_t Quantile(double q) const;
  // {"count", "median", "p99", "max", "buckets"}: what /status and summary.json show.
  nlohmann::json ToJson() const;

 private:
  std::vector<int64_t> buckets_ = std::vector<int64_t>(kBuckets, 0);
  int64_t max_ = 0;
  int64_t count_ = 0;
  int64_t sum_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_STALENESS_HISTOGRAM_H_

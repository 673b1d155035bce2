#include "common/model/staleness_histogram.h"

#include <algorithm>

namespace tessera {

void StalenessHistogram::Add(int64_t staleness) {
  staleness = std::max<int64_t>(0, staleness);
  ++buckets_[std::min<int64_t>(staleness, kBuckets - 1)];
  max_ = std::max(max_, staleness);
  ++count_;
  sum_ += staleness;
}

void StalenessHistogram::Merge(const tessera::v1::StalenessHistogram& other) {
  for (int i = 0; i < other.bucket_size(); ++i) buckets_[std::min(i, kBuckets - 1)] += other.bucket(i);
  max_ = std::max(max_, other.max());
  count_ += other.count();
  sum_ += other.sum();
}

int64_t StalenessHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double wanted = q * static_cast<double>(count_);
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i];
    if (static_cast<double>(seen) >= wanted && seen > 0) return i;
  }
  return kBuckets - 1;
}

nlohmann::json StalenessHistogram::ToJson() const {
  const tessera::v1::StalenessHistogram proto = ToProto();
  return {{"count", count_},
          {"median", Quantile(0.5)},
          {"p99", Quantile(0.99)},
          {"max", max_},
          {"buckets", std::vector<int64_t>(proto.bucket().begin(), proto.bucket().end())}};
}

tessera::v1::StalenessHistogram StalenessHistogram::ToProto() const {
  tessera::v1::StalenessHistogram out;
  int last = 0;
  for (int i = 0; i < kBuckets; ++i) {
    if (buckets_[i] != 0) last = i + 1;
  }
  for (int i = 0; i < last; ++i) out.add_bucket(buckets_[i]);
  out.set_max(max_);
  out.set_count(count_);
  out.set_sum(sum_);
  return out;
}

}  // namespace tessera

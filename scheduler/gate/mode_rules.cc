#include "scheduler/gate/mode_rules.h"

#include <algorithm>

namespace tessera {

ModeRules ModeRules::ForJob(const tessera::v1::ConsistencySpec& consistency) {
  ModeRules rules;
  switch (consistency.mode()) {
    case tessera::v1::ConsistencySpec::ASYNC:
      rules.gate_bound = -1;
      rules.consistent_cut = false;
      rules.start_ = Start::kOwn;
      break;
    case tessera::v1::ConsistencySpec::SSP:
      rules.gate_bound = consistency.staleness();
      rules.consistent_cut = false;
      rules.start_ = Start::kOwnOrSlowest;
      break;
    default:
      rules.gate_bound = 0;
      rules.consistent_cut = true;
      rules.backup_workers = consistency.backup_workers();
      rules.start_ = Start::kAfterNewest;
      break;
  }
  return rules;
}

int64_t ModeRules::ReturningStart(int64_t own, const std::vector<int64_t>& active) const {
  if (active.empty()) return own;
  switch (start_) {
    case Start::kOwn:
      return own;
    case Start::kOwnOrSlowest:
      return std::max(own, *std::min_element(active.begin(), active.end()));
    case Start::kAfterNewest:
      // A worker's clock goes out when it starts a step, so no round at or after the newest clock has closed.
      return *std::max_element(active.begin(), active.end()) + 1;
  }
  return own;
}

}  // namespace tessera

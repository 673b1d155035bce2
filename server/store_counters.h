// What a server counts of the pushes it takes, of chunks and of rows alike, for ServerStats (the dashboard, the
// metrics page and the run's summary).
#ifndef TESSERA_SERVER_STORE_COUNTERS_H_
#define TESSERA_SERVER_STORE_COUNTERS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/model/staleness_histogram.h"
#include "proto/ps.pb.h"

namespace tessera {

// Thread-safe.
class StoreCounters {
 public:
  // A push taken: `bytes` of payload; a duplicate (a retry of one applied before); `late`: its round had closed
  // before it came; `staleness` of its gradient when it counts (-1: not counted) for worker `worker`.
  struct Push {
    size_t bytes = 0;
    bool duplicate = false;
    bool late = false;
    int64_t staleness = -1;
    int worker = 0;
    // Delay compensation: the push was corrected, with these squared norms of its gradient and correction.
    bool compensated = false;
    double grad_sq = 0;
    double compensation_sq = 0;
  };
  void CountPush(const Push& push) ABSL_LOCKS_EXCLUDED(mu_);
  // Gradients a closed round left out (backup workers), and a duplicate push of rows found as it applied.
  void CountLate(int64_t gradients) ABSL_LOCKS_EXCLUDED(mu_);
  void CountDuplicate() ABSL_LOCKS_EXCLUDED(mu_);

  // Sets the counters' fields of `stats`.
  void AddTo(tessera::v1::ServerStats& stats) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  int64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t duplicate_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t late_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t push_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compensated_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  double compensated_grad_sq_ ABSL_GUARDED_BY(mu_) = 0;
  double compensation_sq_ ABSL_GUARDED_BY(mu_) = 0;
  StalenessHistogram staleness_ ABSL_GUARDED_BY(mu_);
  std::vector<StalenessHistogram> worker_staleness_ ABSL_GUARDED_BY(mu_);  // by worker id
};

}  // namespace tessera

#endif  // TESSERA_SERVER_STORE_COUNTERS_H_

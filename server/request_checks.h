// The checks a data-plane request to the store takes before it changes anything, whatever it is for (a chunk or
// rows): the view it was made in, and who sent a push, with its sequence number and clocks. Each returns the error
// to answer with.
#ifndef TESSERA_SERVER_REQUEST_CHECKS_H_
#define TESSERA_SERVER_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/store_state.h"
#include "server/tables/chunk.h"

namespace tessera {

// A request made in view `epoch`: FAILED_PRECONDITION for an older one than the server's (carrying the server's
// epoch: GetCurrentEpoch in common/base/status_macros.h), UNAVAILABLE for a newer one (its assignment is on the way).
[[nodiscard]] absl::Status CheckEpochLocked(const StoreState& state, uint64_t epoch)
    ABSL_SHARED_LOCKS_REQUIRED(state.mu);

// The checks of a push that do not depend on its kind: the worker's member key (UNAUTHENTICATED), and that the
// worker, in this incarnation, is in the view (FAILED_PRECONDITION).
[[nodiscard]] absl::Status CheckPusher(const Roster& roster, int worker, uint64_t incarnation,
                                       std::string_view member_key);

// What every push carries: who sends it (as CheckPusher checks it), its sequence number and clocks.
struct PushStamp {
  int worker = 0;
  uint64_t incarnation = 0;
  std::string_view member_key;
  uint64_t seq = 0;
  int64_t clock = 0;
  int64_t read_clock = 0;
};
// The checks every push takes, of a chunk or of rows: the worker id among the job's `workers`, CheckPusher,
// the seq and the clocks within the wire's limits. INVALID_ARGUMENT naming `what`, or CheckPusher's error.
[[nodiscard]] absl::Status CheckPushStamp(const Roster& roster, int workers, const PushStamp& stamp,
                                          const std::string& what);

}  // namespace tessera

#endif  // TESSERA_SERVER_REQUEST_CHECKS_H_

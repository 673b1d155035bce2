// Stragglers made on purpose, so that the consistency modes can be compared on one machine. Three kinds, which
// add up:
//   a fixed delay     every step takes `delay_ms` longer (a slow link, a busy host);
//   a slow device     every step's compute takes `slow_factor` times as long (a slower GPU);
//   transient stalls  each step stalls with probability `stall_probability` for `stall_ms` (preemption, GC,
//                     a noisy neighbour), drawn from a seeded generator: the same seed stalls the same steps.
// Each starts at clock `from_step` (a worker that becomes slow in the middle of a run).
#ifndef TESSERA_WORKER_STRAGGLER_H_
#define TESSERA_WORKER_STRAGGLER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tessera {

struct StragglerOptions {
  int delay_ms = 0;               // --inject_slowdown_ms
  double slow_factor = 1.0;       // --slow_factor; >= 1
  double stall_probability = 0;   // --stall_probability; 0 .. 1
  int stall_ms = 0;               // --stall_ms
  uint64_t stall_seed = 1;        // --stall_seed; combined with the worker's rank
  int64_t from_step = 0;          // --slow_from_step

  bool any() const { return delay_ms > 0 || slow_factor > 1.0 || (stall_probability > 0 && stall_ms > 0); }
  // INVALID_ARGUMENT naming the flag at fault.
  [[nodiscard]] absl::Status Validate() const;
  // The tessera-worker flags that set these options (none for the defaults).
  std::vector<std::string> ToFlags() const;
};

// Thread-compatible.
class Straggler {
 public:
  Straggler(const StragglerOptions& options, int rank) : options_(options), rank_(rank) {}

  // The extra time to spend in the step at `clock`, whose real compute took `compute`.
  absl::Duration ExtraFor(int64_t clock, absl::Duration compute) const;

  // Waits ExtraFor(clock, compute): the stand-in for a slower device, not a synchronisation point.
  void Wait(int64_t clock, absl::Duration compute) const;

 private:
  const StragglerOptions options_;
  const int rank_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_STRAGGLER_H_

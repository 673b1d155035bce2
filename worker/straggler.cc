#include "worker/straggler.h"

#include <thread>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

// A uniform draw in [0, 1) that depends only on (seed, rank, clock): a step stalls or not whatever happened
// before it (a restarted worker stalls at the same clocks). SplitMix64's finaliser.
double Uniform(uint64_t seed, int rank, int64_t clock) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
               static_cast<uint64_t>(clock) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

absl::Status StragglerOptions::Validate() const {
  if (delay_ms < 0) return absl::InvalidArgumentError(absl::StrCat("--inject_slowdown_ms: expected >= 0, got ", delay_ms));
  if (!(slow_factor >= 1.0) || slow_factor > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("--slow_factor: expected 1 .. 1000, got ", slow_factor));
  }
  if (!(stall_probability >= 0 && stall_probability <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--stall_probability: expected 0 .. 1, got ", stall_probability));
  }
  if (stall_ms < 0) return absl::InvalidArgumentError(absl::StrCat("--stall_ms: expected >= 0, got ", stall_ms));
  if (from_step < 0) return absl::InvalidArgumentError(absl::StrCat("--slow_from_step: expected >= 0, got ", from_step));
  return absl::OkStatus();
}

std::vector<std::string> StragglerOptions::ToFlags() const {
  std::vector<std::string> flags;
  if (delay_ms > 0) flags.push_back(absl::StrCat("--inject_slowdown_ms=", delay_ms));
  if (slow_factor > 1.0) flags.push_back(absl::StrCat("--slow_factor=", slow_factor));
  if (stall_probability > 0 && stall_ms > 0) {
    flags.push_back(absl::StrCat("--stall_probability=", stall_probability));
    flags.push_back(absl::StrCat("--stall_ms=", stall_ms));
    flags.push_back(absl::StrCat("--stall_seed=", stall_seed));
  }
  if (from_step > 0 && any()) flags.push_back(absl::StrCat("--slow_from_step=", from_step));
  return flags;
}

absl::Duration Straggler::ExtraFor(int64_t clock, absl::Duration compute) const {
  if (clock < options_.from_step) return absl::ZeroDuration();
  absl::Duration extra = absl::Milliseconds(options_.delay_ms);
  if (options_.slow_factor > 1.0) extra += compute * (options_.slow_factor - 1.0);
  if (options_.stall_ms > 0 && options_.stall_probability > 0 &&
      Uniform(options_.stall_seed, rank_, clock) < options_.stall_probability) {
    extra += absl::Milliseconds(options_.stall_ms);
  }
  return extra;
}

void Straggler::Wait(int64_t clock, absl::Duration compute) const {
  const absl::Duration extra = ExtraFor(clock, compute);
  // A stand-in for a slower device's compute time, not a synchronisation point.
  if (extra > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(extra));
}

}  // namespace tessera

// What one training run is told and tells, shared by its handle (Trainer, worker/trainer.h) and its loop
// (StepLoop, worker/step_loop.h): its options, its result, the progress it publishes and why it must stop.
#ifndef TESSERA_WORKER_TRAINING_RUN_H_
#define TESSERA_WORKER_TRAINING_RUN_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/straggler.h"

namespace tessera {

struct TrainerOptions {
  StragglerOptions straggler;  // extra time per step, to make this worker a straggler on purpose
  // Benchmarks only: replaces forward and backward by waiting this long per step in total, split across the
  // layers in proportion to their weights (half forward, half backward), with gradients of the right sizes.
  // Everything else in the step is the real code. 0: compute for real.
  int simulate_compute_ms = 0;
  std::string dump_params;     // worker 0 writes the final parameters here (see param_file.h)
};

// What a run ended with.
struct TrainerResult {
  int64_t steps = 0;
  double test_accuracy = 0;  // worker 0 (and local mode) only
  std::string stop_reason;
};

// A snapshot of a running trainer, for the worker's /metrics page.
struct TrainerProgress {
  int64_t clock = 0;
  int64_t samples = 0;
  double train_loss = 0;       // mean over the last reporting window
  double samples_per_sec = 0;  // over the last reporting window
  double test_accuracy = 0;    // last evaluation (worker 0)
};

// The progress a running trainer publishes. Thread-safe.
class ProgressBoard {
 public:
  TrainerProgress Get() const {
    absl::MutexLock lock(&mu_);
    return progress_;
  }
  void Update(const std::function<void(TrainerProgress&)>& change) {
    absl::MutexLock lock(&mu_);
    change(progress_);
  }

 private:
  mutable absl::Mutex mu_;
  TrainerProgress progress_ ABSL_GUARDED_BY(mu_);
};

// Why a trainer must stop early, set from any thread (the first reason wins). Thread-safe.
class StopSignal {
 public:
  void Set(absl::Status why) {
    absl::MutexLock lock(&mu_);
    if (why_.ok()) why_ = std::move(why);
  }
  // OK while nobody asked to stop.
  absl::Status Get() const {
    absl::MutexLock lock(&mu_);
    return why_;
  }
  bool set() const { return !Get().ok(); }

 private:
  mutable absl::Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_WORKER_TRAINING_RUN_H_

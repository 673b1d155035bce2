// The training a worker runs: forward and backward on its slice of the global batch, each layer's gradient
// sent as soon as backward produces it, then the step's exchange brings the next step's values and advances
// the clock (ParameterSource::BeginStep); with progress reports and (worker 0) evaluation on the test set.
// Trainer is the handle (run, cancel, progress); the loop itself is StepLoop (step_loop.h).
#ifndef TESSERA_WORKER_TRAINER_H_
#define TESSERA_WORKER_TRAINER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/parameter_source.h"
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

// Not thread-safe, except Cancel() and progress().
class Trainer {
 public:
  // `source` and `backend` are not owned and must outlive the trainer. `stop`, when given, is shared with
  // whoever may need to stop the trainer early (e.g. the client library, when the scheduler is lost).
  Trainer(ParameterSource* source, Backend* backend, TrainerOptions options,
          std::shared_ptr<StopSignal> stop = std::make_shared<StopSignal>())
      : source_(source), backend_(backend), options_(std::move(options)), stop_(std::move(stop)) {}

  // Loads the data (NOT_FOUND naming the Debian package when the data set is missing), declares the model, and
  // trains until the job's stop condition, the scheduler's stop, or Cancel() (CANCELLED).
  [[nodiscard]] absl::StatusOr<TrainerResult> Run();

  // Makes Run() return CANCELLED after the current step (or while waiting for values). Thread-safe.
  void Cancel(const std::string& why = "cancelled") { stop_->Set(absl::CancelledError(why)); }

  // Thread-safe.
  TrainerProgress progress() const { return progress_.Get(); }

 private:
  ParameterSource* const source_;  // not owned
  Backend* const backend_;         // not owned
  const TrainerOptions options_;
  const std::shared_ptr<StopSignal> stop_;
  ProgressBoard progress_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_TRAINER_H_

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
#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/parameter_source.h"
#include "worker/training_run.h"

namespace tessera {

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

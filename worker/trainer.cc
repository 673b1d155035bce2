#include "worker/trainer.h"

#include "worker/step_loop.h"

namespace tessera {

absl::StatusOr<TrainerResult> Trainer::Run() {
  StepLoop loop(source_, backend_, options_, stop_.get(), &progress_);
  return loop.Run();
}

}  // namespace tessera

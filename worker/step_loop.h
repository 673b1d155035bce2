// One training run, step by step (what Trainer::Run does): load the data and declare the model, then per step
// compute on this worker's slice of the global batch with each layer's gradient sent as backward produces it,
// finish the step's exchange (the next values and the clock), evaluate and report; until the job's stop.
//
// A step's values overlap the next step's compute: the step's exchange is kept as `previous_`, and the next
// forward takes each layer's values as they arrive (TakeLayer). A rollback (SYNC: a server was lost and the
// job went back to a checkpoint) voids the step it lands in: the loop goes back to the checkpoint's clock and
// pulls every value again before the next step.
#ifndef TESSERA_WORKER_STEP_LOOP_H_
#define TESSERA_WORKER_STEP_LOOP_H_

#include <array>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend/backend.h"
#include "worker/data/batch_schedule.h"
#include "worker/data/dataset.h"
#include "worker/evaluator.h"
#include "worker/models/mlp.h"
#include "worker/parameter_source.h"
#include "worker/straggler.h"
#include "worker/training_run.h"

namespace tessera {

// Not thread-safe: runs on the trainer's thread. `source`, `backend`, `stop` and `progress` must outlive it.
class StepLoop {
 public:
  StepLoop(ParameterSource* source, Backend* backend, const TrainerOptions& options, const StopSignal* stop,
           ProgressBoard* progress);

  // Loads the data (NOT_FOUND naming the Debian package when the data set is missing), declares the model, and
  // trains until the job's stop condition, the scheduler's stop, or `stop` (its status, annotated).
  absl::StatusOr<TrainerResult> Run();

 private:
  // How a step ended.
  enum class StepEnd { kNext, kVoid, kStop };

  absl::Status Prepare();
  // Every value from the servers into the host buffers and the model.
  absl::Status PullAll();
  // One step: compute, the exchange, then evaluation and reports when due.
  absl::StatusOr<StepEnd> Step();
  // This worker's examples of step `clock_` into x_ and y_; returns how many.
  size_t LoadBatch();
  // Forward and backward (or the stand-in for them), sending each layer's gradients as they are copied.
  absl::Status Compute(size_t n, LossSums& sums);
  // Waits for layer `layer`'s values of the last step (both its tensors) and gives them to the model.
  absl::Status TakeLayer(int layer);
  // Starts the copies of layer `layer`'s gradients to the host and sends what is copied.
  absl::Status SendLayer(int layer);
  // Starts copying gradient `index`'s values [copy_started_[index], end) to the host (device backends).
  absl::Status StartCopy(int index, size_t end);
  // Sends the gradients, and parts, whose copies are in (with `wait`, all of them, waiting).
  absl::Status SendCopied(bool wait);
  // Every value of the last step in place (before an evaluation, a parameter dump or the end).
  absl::Status Settle();
  // The one rollback check: true when the job went back to a checkpoint since the last look. The step is then
  // void: the loop goes back to the checkpoint's clock, and the next step starts with a pull of every value.
  bool TakeRollback();
  // Puts set `set`'s values of parameter `i` in place for the model: read in place, or copied into it.
  absl::Status UseValues(int i, int set);
  // Worker 0: offers the values to the evaluator when an evaluation is due, and reports finished ones.
  absl::StatusOr<StepEnd> Evaluate();
  // Sends a progress report (with an evaluation's result when given); true when the job says stop.
  absl::StatusOr<bool> Report(const EvalResult* eval);
  // Evaluations finished since the last look, reported; true when the job says stop.
  absl::StatusOr<bool> ReportEvaluations();
  // The end of the run: the last values, the last evaluation, the parameter dump, Done.
  absl::StatusOr<TrainerResult> Finish(bool stopped);

  ParameterSource* const source_;
  Backend* const backend_;
  const TrainerOptions& options_;
  const StopSignal* const stop_;
  ProgressBoard* const progress_;
  const int rank_;
  const bool evaluates_;  // worker 0
  const Straggler straggler_;

  std::unique_ptr<Dataset> train_;
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<Mlp> model_;
  std::unique_ptr<BatchSchedule> schedule_;
  int64_t stop_clock_ = 0;
  // Host copies of every parameter and gradient, and the span lists the parameter source takes. On a backend
  // whose buffers are host memory (host_memory_) the model reads its parameters from two sets of values in
  // turn, one while the step's exchange writes the next into the other (no copy into the model), and the
  // gradients are sent from the model's own memory (grads_ stays empty). Elsewhere set 0 alone is used and
  // copied into the model.
  std::vector<std::string> names_;
  std::array<std::vector<std::vector<float>>, 2> value_sets_;
  std::array<std::vector<absl::Span<float>>, 2> value_spans_;
  std::vector<std::vector<float>> grads_;
  bool host_memory_ = false;
  int current_ = 0;  // the set the model reads (all of it, between steps)
  int landing_ = 0;  // the set previous_'s exchange writes into
  std::vector<absl::Span<const float>> grad_spans_;
  // Room for a whole global batch: a balanced SYNC job may give this worker any part of it.
  std::vector<float> x_;
  std::vector<int32_t> y_;

  TrainerResult result_;
  int64_t clock_ = 0;  // also the data position: batches are a function of the clock
  bool pull_needed_ = true;  // before the first step, and after a rollback
  std::unique_ptr<StepExchange> previous_;  // the last step's exchange, whose values may still be arriving
  std::unique_ptr<StepExchange> step_;      // this step's
  // Gradients, or blocks of a weight gradient's first rows, on their way to the host (device backends), oldest
  // first: once values [0, end) of gradient `index` are in, they leave.
  struct GradientCopy {
    int index;
    size_t end;
    std::unique_ptr<PendingDownload> download;
  };
  std::deque<GradientCopy> copying_;
  std::vector<size_t> copy_started_;  // per gradient: the values whose copy has started in this step
  absl::Duration last_compute_;       // the last step's forward and backward, without waits for values
  absl::Duration waited_for_values_;  // this step's waits for the last step's values

  // Progress since the last report.
  double loss_sum_ = 0;
  int64_t loss_steps_ = 0, samples_total_ = 0, samples_window_ = 0;
  absl::Time window_start_;
  int64_t last_eval_clock_ = -1;
  absl::Time last_offer_;
  int64_t last_offer_clock_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_STEP_LOOP_H_

// Evaluation off the training loop. The evaluating worker (rank 0) hands a copy of its parameters, with the
// clock they belong to, to an Evaluator; a thread of the Evaluator's own scores it on the test set with a model
// of its own, on the CPU, while training goes on. The training loop collects finished results (Take) and
// reports them; a training step never waits for an evaluation, so staleness and round times reflect training
// only. When an evaluation is asked for while one is running, the newest values wait and older ones are dropped.
#ifndef TESSERA_WORKER_EVALUATOR_H_
#define TESSERA_WORKER_EVALUATOR_H_

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/data/dataset.h"
#include "worker/models/mlp.h"

namespace tessera {

struct EvalResult {
  int64_t clock = 0;  // the clock the evaluated values belong to
  double test_loss = 0;
  double test_accuracy = 0;
};

// Thread-safe.
class Evaluator {
 public:
  // A model of `layer_sizes` on a CPU backend of its own, scored on `test`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Evaluator>> Create(std::vector<int> layer_sizes, Dataset test,
                                                                         uint64_t seed);
  ~Evaluator();  // waits for a running evaluation; drops a waiting one

  // Evaluates `values` (the model's parameters in order) of `clock` on the evaluator's thread.
  void Offer(int64_t clock, std::vector<std::vector<float>> values);
  // The finished evaluations since the last call, oldest first; the first failure instead, if one failed.
  [[nodiscard]] absl::StatusOr<std::vector<EvalResult>> Take();
  // Waits until every evaluation offered so far has finished (the end of a run: its results are reported too).
  void Drain();
  // Evaluates `values` on the caller's thread (the last evaluation of a run).
  [[nodiscard]] absl::StatusOr<EvalResult> EvaluateNow(int64_t clock, const std::vector<std::vector<float>>& values);

 private:
  struct Job {
    int64_t clock;
    std::vector<std::vector<float>> values;
  };
  Evaluator(std::unique_ptr<Backend> backend, std::unique_ptr<Mlp> model, Dataset test);
  void Run();
  absl::StatusOr<EvalResult> Evaluate(int64_t clock, const std::vector<std::vector<float>>& values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(model_mu_);

  const std::unique_ptr<Backend> backend_;
  absl::Mutex model_mu_;
  const std::unique_ptr<Mlp> model_ ABSL_PT_GUARDED_BY(model_mu_);
  const Dataset test_;

  absl::Mutex mu_;
  std::optional<Job> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<EvalResult> finished_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // an evaluation is under way on the thread
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_EVALUATOR_H_

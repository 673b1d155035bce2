#include "worker/evaluator.h"

#include "common/base/status_macros.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(std::vector<int> layer_sizes, Dataset test,
                                                             uint64_t seed) {
  BackendOptions options;
  options.cpu_threads = 0;  // the worker's backend set the process's BLAS threads; they stay
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu", options));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> model,
                           Mlp::Create(backend.get(), std::move(layer_sizes), seed, /*max_batch=*/1000));
  return std::unique_ptr<Evaluator>(new Evaluator(std::move(backend), std::move(model), std::move(test)));
}

Evaluator::Evaluator(std::unique_ptr<Backend> backend, std::unique_ptr<Mlp> model, Dataset test)
    : backend_(std::move(backend)), model_(std::move(model)), test_(std::move(test)) {
  thread_ = std::thread([this] { Run(); });
}

Evaluator::~Evaluator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Evaluator::Offer(int64_t clock, std::vector<std::vector<float>> values) {
  absl::MutexLock lock(&mu_);
  waiting_ = Job{clock, std::move(values)};
}

absl::StatusOr<std::vector<EvalResult>> Evaluator::Take() {
  absl::MutexLock lock(&mu_);
  TESSERA_RETURN_IF_ERROR(failed_);
  std::vector<EvalResult> out;
  out.swap(finished_);
  return out;
}

void Evaluator::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Evaluator* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return !e->running_ && !e->waiting_.has_value(); },
      this));
}

absl::StatusOr<EvalResult> Evaluator::EvaluateNow(int64_t clock, const std::vector<std::vector<float>>& values) {
  absl::MutexLock lock(&model_mu_);
  return Evaluate(clock, values);
}

absl::StatusOr<EvalResult> Evaluator::Evaluate(int64_t clock, const std::vector<std::vector<float>>& values) {
  for (size_t i = 0; i < values.size(); ++i) TESSERA_RETURN_IF_ERROR(model_->SetParameter(static_cast<int>(i), values[i]));
  TESSERA_ASSIGN_OR_RETURN(LossSums sums, model_->Evaluate(test_.x, test_.y));
  EvalResult result;
  result.clock = clock;
  result.test_loss = sums.loss / test_.size();
  result.test_accuracy = static_cast<double>(sums.correct) / test_.size();
  return result;
}

void Evaluator::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Evaluator* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || e->waiting_.has_value(); },
          this));
      if (stopping_) return;
      job = std::move(*waiting_);
      waiting_.reset();
      running_ = true;
    }
    absl::StatusOr<EvalResult> result;
    {
      absl::MutexLock lock(&model_mu_);
      result = Evaluate(job.clock, job.values);
    }
    absl::MutexLock lock(&mu_);
    running_ = false;
    if (result.ok()) {
      finished_.push_back(*result);
    } else if (failed_.ok()) {
      failed_ = result.status();
    }
  }
}

}  // namespace tessera

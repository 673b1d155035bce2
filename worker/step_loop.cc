#include "worker/step_loop.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "glog/logging.h"
#include "worker/param_file.h"

namespace tessera {
namespace {

// The stand-in for a GPU step: waits `total_ms` split across the layers in proportion to their weights, half
// as forward (first layer first, after `needed`) and half as backward (last layer first, announcing each
// layer's gradients, and the blocks of its weight gradient as the model's backward would,
// Mlp::WeightGradientBlocks). Backward's blocks end on one clock, as a device's kernels run back to back while
// the host sends what they produced: the time the announcements take is not added to the compute's. The
// gradients keep whatever values they hold (their sizes are the model's).
absl::Status SimulateCompute(const Mlp& model, int total_ms, const Mlp::LayerNeeded& needed,
                             const Mlp::LayerGradientsReady& ready, const Mlp::GradientPartReady& part) {
  std::vector<double> weight(model.layers());
  double sum = 0;
  for (int l = 0; l < model.layers(); ++l) {
    weight[l] = static_cast<double>(NumElements(model.parameters()[2 * l].shape()));
    sum += weight[l];
  }
  using Clock = std::chrono::steady_clock;
  auto compute = [&](int l, double fraction) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(0.5 * total_ms * weight[l] / sum * fraction));
  };
  // A stand-in for compute time (benchmarks only), not a synchronisation point.
  for (int l = 0; l < model.layers(); ++l) {
    TESSERA_RETURN_IF_ERROR(needed(l));
    std::this_thread::sleep_for(compute(l, 1.0));
  }
  Clock::time_point end_of_block = Clock::now();
  for (int l = model.layers() - 1; l >= 0; --l) {
    const std::vector<size_t> blocks = model.WeightGradientBlocks(l);
    size_t done = 0;
    for (size_t end : blocks) {
      end_of_block += compute(l, static_cast<double>(end - done) / weight[l]);
      std::this_thread::sleep_until(end_of_block);
      done = end;
      if (end < blocks.back()) TESSERA_RETURN_IF_ERROR(part(2 * l, end));
    }
    TESSERA_RETURN_IF_ERROR(ready(l));
  }
  return absl::OkStatus();
}

}  // namespace

StepLoop::StepLoop(ParameterSource* source, Backend* backend, const TrainerOptions& options, const StopSignal* stop,
                   ProgressBoard* progress)
    : source_(source),
      backend_(backend),
      options_(options),
      stop_(stop),
      progress_(progress),
      rank_(source->rank()),
      evaluates_(source->rank() == 0),
      straggler_(options.straggler, source->rank()) {}

absl::Status StepLoop::Prepare() {
  const tessera::v1::JobSpec& job = source_->job();
  const int workers = source_->num_workers();
  // A job for scripts (tessera.torch) may name no model, and may leave the optimizer to them.
  if (job.model().kind_case() == tessera::v1::ModelSpec::KIND_NOT_SET) {
    return absl::FailedPreconditionError(
        "the job names no model { softmax_regression {} or mlp { hidden_sizes: ... } }: tessera-worker trains "
        "that built-in model; a job without one is for scripts (tessera-launch ... -- python3 script.py)");
  }
  if (job.optimizer().kind() == tessera::v1::OptimizerSpec::SCRIPT) {
    return absl::FailedPreconditionError(
        "the job's optimizer { kind: SCRIPT } is the workers' own (tessera.torch.DistributedOptimizer); "
        "tessera-worker steps the servers' optimizer only (SGD, ADAM, ADAMW)");
  }
  TESSERA_ASSIGN_OR_RETURN(Dataset train, LoadSplit(job.data(), /*train=*/true, job.seed()));
  train_ = std::make_unique<Dataset>(std::move(train));
  // The data's own widths (an IDX file's, known only now) within what a worker may be asked to allocate.
  TESSERA_RETURN_IF_ERROR(CheckModelSize(job, train_->features, train_->classes));
  const std::vector<int> layer_sizes = Mlp::LayerSizes(job.model(), train_->features, train_->classes);
  if (evaluates_) {
    TESSERA_ASSIGN_OR_RETURN(Dataset test, LoadSplit(job.data(), /*train=*/false, job.seed()));
    TESSERA_ASSIGN_OR_RETURN(evaluator_, Evaluator::Create(layer_sizes, std::move(test), job.seed()));
  }
  const int64_t global_batch = static_cast<int64_t>(job.batch_size()) * workers;
  if (train_->size() < global_batch) {
    return absl::InvalidArgumentError(absl::StrCat("the training set has ", train_->size(),
                                                   " examples, fewer than one global batch of ", global_batch));
  }
  TESSERA_ASSIGN_OR_RETURN(model_, Mlp::Create(backend_, layer_sizes, job.seed(),
                                               static_cast<int>(std::max<int64_t>(global_batch, 1000))));
  TESSERA_RETURN_IF_ERROR(source_->Declare(model_->parameters()));
  // A layer's weight gradient leaves a chunk at a time as backward produces it (where the backend can).
  model_->set_gradient_block(static_cast<size_t>(std::max<int64_t>(job.chunk_bytes() / sizeof(float), 1)));
  schedule_ = std::make_unique<BatchSchedule>(train_->size(), job.batch_size(), workers, rank_, job.seed());
  stop_clock_ = StopClock(job, schedule_->steps_per_epoch());
  LOG(INFO) << "worker " << rank_ << " of " << workers << " on " << backend_->name() << ": " << train_->size()
            << " training examples, " << schedule_->steps_per_epoch() << " steps per epoch, batch "
            << job.batch_size();

  // Where the model's memory is the host's, its gradients are read in place (backward writes parameter i's
  // again only after the next forward waited for its exchange, TakeLayer, so no send still reads it then), and
  // its parameters too, from the set of values that is not being written.
  host_memory_ = backend_->host_memory();
  for (int i = 0; i < model_->num_parameters(); ++i) {
    const tessera::v1::ParameterSpec& p = model_->parameters()[i];
    names_.push_back(p.name());
    for (int set = 0; set < (host_memory_ ? 2 : 1); ++set) value_sets_[set].emplace_back(NumElements(p.shape()));
    if (!host_memory_) grads_.emplace_back(NumElements(p.shape()));
  }
  for (int set = 0; set < 2; ++set) {
    for (auto& v : value_sets_[set]) value_spans_[set].push_back(absl::MakeSpan(v));
  }
  for (int i = 0; i < model_->num_parameters(); ++i) {
    grad_spans_.push_back(host_memory_ ? model_->HostGradient(i) : absl::MakeConstSpan(grads_[i]));
  }
  x_.resize(static_cast<size_t>(global_batch) * train_->features);
  y_.resize(global_batch);
  clock_ = source_->start_clock();
  if (clock_ > 0) LOG(INFO) << "worker " << rank_ << " starts at clock " << clock_;
  window_start_ = last_offer_ = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<TrainerResult> StepLoop::Run() {
  TESSERA_RETURN_IF_ERROR(Prepare());
  bool stopped = false;  // the scheduler ended the job (gate or report) before this worker's last step
  while (!stopped) {
    if (pull_needed_) {
      absl::Status pulled = PullAll();
      if (!pulled.ok() && !TakeRollback()) return pulled;  // a rollback meanwhile voids the pull: again
      if (!pulled.ok()) continue;
      pull_needed_ = false;
    }
    if (clock_ >= stop_clock_) break;
    if (absl::Status why = stop_->Get(); !why.ok()) {
      return Annotate(why, absl::StrCat("worker ", rank_, " stopped at clock ", clock_));
    }
    TESSERA_ASSIGN_OR_RETURN(StepEnd end, Step());
    stopped = end == StepEnd::kStop;
  }
  return Finish(stopped);
}

absl::Status StepLoop::PullAll() {
  // Nothing is in flight: the pull may write the set the model reads.
  TESSERA_RETURN_IF_ERROR(source_->Pull(names_, value_spans_[current_]));
  for (int i = 0; i < model_->num_parameters(); ++i) TESSERA_RETURN_IF_ERROR(UseValues(i, current_));
  return absl::OkStatus();
}

absl::Status StepLoop::UseValues(int i, int set) {
  if (host_memory_) return model_->BindParameter(i, value_spans_[set][i]);
  return model_->SetParameter(i, value_sets_[0][i]);
}

bool StepLoop::TakeRollback() {
  std::optional<int64_t> to = source_->TakeRollback();
  if (!to) return false;
  LOG(WARNING) << "worker " << rank_ << ": the job went back to clock " << *to << " (from " << clock_
               << "); training on from there";
  step_.reset();
  previous_.reset();
  clock_ = *to;
  pull_needed_ = true;
  progress_->Update([&](TrainerProgress& p) { p.clock = clock_; });
  return true;
}

size_t StepLoop::LoadBatch() {
  const BatchSlice slice = source_->batch_slice();
  const std::vector<int64_t> batch =
      slice.count > 0 ? schedule_->Slice(clock_, slice.offset, slice.count) : schedule_->Batch(clock_);
  for (size_t i = 0; i < batch.size(); ++i) {
    absl::Span<const float> example = train_->Example(batch[i]);
    std::copy(example.begin(), example.end(), x_.begin() + i * train_->features);
    y_[i] = train_->y[batch[i]];
  }
  return batch.size();
}

absl::StatusOr<StepLoop::StepEnd> StepLoop::Step() {
  const size_t n = LoadBatch();
  // A straggler on purpose computes longer: its extra time goes before the step (from the last step's compute
  // time, for a slower device), and counts as compute.
  const absl::Time busy_start = absl::Now();
  straggler_.Wait(clock_, last_compute_);
  waited_for_values_ = absl::ZeroDuration();
  const absl::Time compute_start = absl::Now();
  // The exchange writes the set the model will not read in this step: not the one the last exchange writes
  // (forward takes its values), nor, without one, the one the model reads now.
  const int landing = host_memory_ ? 1 - (previous_ ? landing_ : current_) : 0;
  step_ = source_->BeginStep(names_, grad_spans_, static_cast<int>(n), value_spans_[landing]);
  LossSums sums;
  absl::Status computed = Compute(n, sums);
  last_compute_ = absl::Now() - compute_start - waited_for_values_;
  source_->NoteStep(static_cast<int>(n), absl::Now() - busy_start - waited_for_values_);
  if (!computed.ok() && TakeRollback()) return StepEnd::kVoid;
  // A forward that stopped waiting because the job is over ends here, with the clock's stop below.
  if (!computed.ok() && !(computed.code() == absl::StatusCode::kAborted && step_->stopped())) return computed;
  absl::StatusOr<ClockResult> finished = step_->Finish();
  if (TakeRollback()) return StepEnd::kVoid;
  TESSERA_ASSIGN_OR_RETURN(ClockResult gate, std::move(finished));
  previous_ = std::move(step_);
  landing_ = landing;
  loss_sum_ += sums.loss / n;
  ++loss_steps_;
  samples_total_ += n;
  samples_window_ += n;
  clock_ = gate.clock;
  progress_->Update([&](TrainerProgress& p) {
    p.clock = clock_;
    p.samples = samples_total_;
  });
  if (gate.stop) {
    result_.stop_reason = gate.stop_reason;
    return StepEnd::kStop;
  }
  if (evaluates_) {
    TESSERA_ASSIGN_OR_RETURN(StepEnd end, Evaluate());
    if (end != StepEnd::kNext) return end;
  }
  if (clock_ % source_->job().eval_every_steps() == 0) {
    TESSERA_ASSIGN_OR_RETURN(bool stop, Report(nullptr));
    if (stop) return StepEnd::kStop;
  }
  return StepEnd::kNext;
}

absl::Status StepLoop::Compute(size_t n, LossSums& sums) {
  // Each layer's gradients leave for the servers while backward goes on with the layers below: the copy to the
  // host starts when backward announces the layer, and the gradient is sent once its copy is in (at once on a
  // CPU; on a GPU the copies run on a stream of their own and are collected as they finish).
  copying_.clear();
  copy_started_.assign(grads_.size(), 0);
  auto needed = [this](int layer) { return TakeLayer(layer); };
  auto ready = [this](int layer) { return SendLayer(layer); };
  // A finished block of a weight gradient's rows (Mlp::set_gradient_block) leaves as it is from host memory, and
  // on a GPU once its copy is in.
  auto part = [this](int index, size_t values) {
    if (host_memory_) return step_->SendPart(index, values);
    TESSERA_RETURN_IF_ERROR(StartCopy(index, values));
    return SendCopied(/*wait=*/false);
  };
  if (options_.simulate_compute_ms > 0) {
    TESSERA_RETURN_IF_ERROR(SimulateCompute(*model_, options_.simulate_compute_ms, needed, ready, part));
  } else {
    TESSERA_ASSIGN_OR_RETURN(sums, model_->ForwardBackward(absl::MakeConstSpan(x_).first(n * train_->features),
                                                           absl::MakeConstSpan(y_).first(n), ready, needed, part));
  }
  return SendCopied(/*wait=*/true);
}

absl::Status StepLoop::TakeLayer(int layer) {
  if (!previous_) return absl::OkStatus();
  for (int i : {2 * layer, 2 * layer + 1}) {
    const absl::Time wait_start = absl::Now();
    absl::Status waited = previous_->WaitValues(i, [&] { return (step_ && step_->stopped()) || stop_->set(); });
    waited_for_values_ += absl::Now() - wait_start;
    TESSERA_RETURN_IF_ERROR(waited);
    TESSERA_RETURN_IF_ERROR(UseValues(i, landing_));
  }
  current_ = landing_;
  return absl::OkStatus();
}

absl::Status StepLoop::SendLayer(int layer) {
  if (host_memory_) {
    for (int i : {2 * layer, 2 * layer + 1}) TESSERA_RETURN_IF_ERROR(step_->Send(i));
    return absl::OkStatus();
  }
  for (int i : {2 * layer, 2 * layer + 1}) TESSERA_RETURN_IF_ERROR(StartCopy(i, grads_[i].size()));
  return SendCopied(/*wait=*/false);
}

absl::Status StepLoop::StartCopy(int index, size_t end) {
  const size_t begin = copy_started_[index];
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<PendingDownload> download,
                           model_->StartGradientDownload(index, begin, absl::MakeSpan(grads_[index]).subspan(
                                                                           begin, end - begin)));
  copy_started_[index] = end;
  copying_.push_back(GradientCopy{index, end, std::move(download)});
  return absl::OkStatus();
}

absl::Status StepLoop::SendCopied(bool wait) {
  while (!copying_.empty() && (wait || copying_.front().download->Ready())) {
    const GradientCopy& copy = copying_.front();
    TESSERA_RETURN_IF_ERROR(copy.download->Wait());
    // The values up to copy.end are on the host; the whole gradient once its last part is.
    TESSERA_RETURN_IF_ERROR(copy.end == grads_[copy.index].size() ? step_->Send(copy.index)
                                                                  : step_->SendPart(copy.index, copy.end));
    copying_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status StepLoop::Settle() {
  for (int l = 0; previous_ && l < model_->layers(); ++l) TESSERA_RETURN_IF_ERROR(TakeLayer(l));
  previous_.reset();
  return absl::OkStatus();
}

absl::StatusOr<StepLoop::StepEnd> StepLoop::Evaluate() {
  const tessera::v1::JobSpec& job = source_->job();
  const bool due = clock_ % job.eval_every_steps() == 0 ||
                   (job.eval_every_seconds() > 0 && absl::Now() - last_offer_ >= absl::Seconds(job.eval_every_seconds()));
  if (due && clock_ != last_offer_clock_) {
    // The evaluator gets every value of this clock: the last exchange settles first (one step without overlap
    // per evaluation), then training goes on while the copy is scored.
    absl::Status settled = Settle();
    if (!settled.ok() && TakeRollback()) return StepEnd::kVoid;
    if (absl::IsAborted(settled)) {  // the job ended while this step's round was open
      result_.stop_reason = std::string(settled.message());
      return StepEnd::kStop;
    }
    TESSERA_RETURN_IF_ERROR(settled);
    evaluator_->Offer(clock_, value_sets_[current_]);
    last_offer_ = absl::Now();
    last_offer_clock_ = clock_;
  }
  TESSERA_ASSIGN_OR_RETURN(bool stop, ReportEvaluations());
  return stop ? StepEnd::kStop : StepEnd::kNext;
}

absl::StatusOr<bool> StepLoop::Report(const EvalResult* eval) {
  tessera::v1::ReportRequest r;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - window_start_);
  r.set_train_loss(loss_steps_ > 0 ? loss_sum_ / loss_steps_ : 0.0);
  r.set_samples_per_sec(seconds > 0 ? samples_window_ / seconds : 0.0);
  r.set_samples(samples_total_);
  r.set_epoch(schedule_->Epochs(eval != nullptr ? eval->clock : clock_));
  r.set_device(backend_->name());
  if (eval != nullptr) {
    r.set_has_eval(true);
    r.set_eval_clock(eval->clock);
    r.set_test_loss(eval->test_loss);
    r.set_test_accuracy(eval->test_accuracy);
    result_.test_accuracy = eval->test_accuracy;
    last_eval_clock_ = eval->clock;
  }
  progress_->Update([&](TrainerProgress& p) {
    p.train_loss = r.train_loss();
    p.samples_per_sec = r.samples_per_sec();
    if (eval != nullptr) p.test_accuracy = r.test_accuracy();
  });
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::ReportResponse answer, source_->Report(r));
  loss_sum_ = 0;
  loss_steps_ = 0;
  samples_window_ = 0;
  window_start_ = absl::Now();
  if (answer.stop() && result_.stop_reason.empty()) result_.stop_reason = answer.stop_reason();
  return answer.stop();
}

absl::StatusOr<bool> StepLoop::ReportEvaluations() {
  TESSERA_ASSIGN_OR_RETURN(std::vector<EvalResult> finished, evaluator_->Take());
  for (const EvalResult& eval : finished) {
    TESSERA_ASSIGN_OR_RETURN(bool stop, Report(&eval));
    if (stop) return true;
  }
  return false;
}

absl::StatusOr<TrainerResult> StepLoop::Finish(bool stopped) {
  // Rounds the job stopped in may never close: only a job that ran its course waits for its last values.
  if (stopped) {
    previous_.reset();
  } else {
    TESSERA_RETURN_IF_ERROR(Settle());
  }
  if (result_.stop_reason.empty()) result_.stop_reason = absl::StrCat("reached step ", clock_);
  if (evaluates_) {
    // Training is over: evaluations still under way are waited for and reported, and the last values are
    // scored here, on this thread.
    evaluator_->Drain();
    TESSERA_RETURN_IF_ERROR(ReportEvaluations().status());
    if (last_eval_clock_ != clock_) {
      // A job stopped mid-step may have left the values partly written: the servers' are scored then. Servers
      // that no longer answer (the job is over) leave the last evaluation standing; the job's end is no error.
      absl::Status pulled = stopped ? PullAll() : absl::OkStatus();
      if (pulled.ok()) {
        TESSERA_ASSIGN_OR_RETURN(EvalResult last, evaluator_->EvaluateNow(clock_, value_sets_[current_]));
        TESSERA_RETURN_IF_ERROR(Report(&last).status());
      } else {
        LOG(WARNING) << "worker " << rank_ << ": the last values could not be pulled after the job's stop ("
                     << pulled << "); the evaluation of clock " << last_eval_clock_ << " is the last";
      }
    }
    if (!options_.dump_params.empty()) {
      TESSERA_RETURN_IF_ERROR(PullAll());
      NamedTensors tensors;
      for (size_t i = 0; i < names_.size(); ++i) tensors[names_[i]] = value_sets_[current_][i];
      TESSERA_RETURN_IF_ERROR(WriteParamFile(options_.dump_params, tensors));
    }
  }
  TESSERA_RETURN_IF_ERROR(source_->Done());
  result_.steps = clock_;
  LOG(INFO) << "worker " << rank_ << " finished after " << clock_ << " steps: " << result_.stop_reason;
  return result_;
}

}  // namespace tessera

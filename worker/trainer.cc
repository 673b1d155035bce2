#include "worker/trainer.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "glog/logging.h"
#include "worker/data/batch_schedule.h"
#include "worker/data/dataset.h"
#include "worker/evaluator.h"
#include "worker/models/mlp.h"
#include "worker/param_file.h"

namespace tessera {
namespace {

// Host copies of every parameter and gradient, with the span lists PsClient takes.
struct HostTensors {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;

  explicit HostTensors(const Mlp& model) {
    for (const auto& p : model.parameters()) {
      names.push_back(p.name());
      values.emplace_back(NumElements(p.shape()));
      grads.emplace_back(NumElements(p.shape()));
    }
  }
  std::vector<absl::Span<float>> ValueSpans() {
    std::vector<absl::Span<float>> out;
    for (auto& v : values) out.push_back(absl::MakeSpan(v));
    return out;
  }
  std::vector<absl::Span<const float>> GradSpans() const {
    std::vector<absl::Span<const float>> out;
    for (const auto& g : grads) out.push_back(absl::MakeConstSpan(g));
    return out;
  }
};

absl::Status PullInto(ParameterSource& source, HostTensors& host, Mlp& model) {
  TESSERA_RETURN_IF_ERROR(source.Pull(host.names, host.ValueSpans()));
  for (int i = 0; i < model.num_parameters(); ++i) TESSERA_RETURN_IF_ERROR(model.SetParameter(i, host.values[i]));
  return absl::OkStatus();
}

// The stand-in for a GPU step: waits `total_ms` split across the layers in proportion to their weights, half
// as forward (first layer first, after `needed`) and half as backward (last layer first, announcing each
// layer's gradients). The gradients keep whatever values they hold (their sizes are the model's).
absl::Status SimulateCompute(const Mlp& model, int total_ms, const Mlp::LayerNeeded& needed,
                             const Mlp::LayerGradientsReady& ready) {
  std::vector<double> weight(model.layers());
  double sum = 0;
  for (int l = 0; l < model.layers(); ++l) {
    weight[l] = static_cast<double>(NumElements(model.parameters()[2 * l].shape()));
    sum += weight[l];
  }
  auto wait = [&](int l) {
    // A stand-in for compute time (benchmarks only), not a synchronisation point.
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(0.5 * total_ms * weight[l] / sum));
  };
  for (int l = 0; l < model.layers(); ++l) {
    TESSERA_RETURN_IF_ERROR(needed(l));
    wait(l);
  }
  for (int l = model.layers() - 1; l >= 0; --l) {
    wait(l);
    TESSERA_RETURN_IF_ERROR(ready(l));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainerResult> Trainer::Run() {
  const tessera::v1::JobSpec& job = source_->job();
  const int rank = source_->rank();
  const int workers = source_->num_workers();
  const bool evaluates = rank == 0;

  TESSERA_ASSIGN_OR_RETURN(Dataset train, LoadSplit(job.data(), /*train=*/true, job.seed()));
  // The data's own widths (an IDX file's, known only now) within what a worker may be asked to allocate.
  TESSERA_RETURN_IF_ERROR(CheckModelSize(job, train.features, train.classes));
  std::unique_ptr<Evaluator> evaluator;
  if (evaluates) {
    TESSERA_ASSIGN_OR_RETURN(Dataset test, LoadSplit(job.data(), /*train=*/false, job.seed()));
    TESSERA_ASSIGN_OR_RETURN(evaluator,
                             Evaluator::Create(Mlp::LayerSizes(job.model(), train.features, train.classes),
                                               std::move(test), job.seed()));
  }
  const int64_t global_batch = static_cast<int64_t>(job.batch_size()) * workers;
  if (train.size() < global_batch) {
    return absl::InvalidArgumentError(absl::StrCat("the training set has ", train.size(),
                                                   " examples, fewer than one global batch of ", global_batch));
  }
  TESSERA_ASSIGN_OR_RETURN(
      std::unique_ptr<Mlp> model,
      Mlp::Create(backend_, Mlp::LayerSizes(job.model(), train.features, train.classes), job.seed(),
                  static_cast<int>(std::max<int64_t>(global_batch, 1000))));
  TESSERA_RETURN_IF_ERROR(source_->Declare(model->parameters()));
  BatchSchedule schedule(train.size(), job.batch_size(), workers, rank, job.seed());

  int64_t stop_clock = std::numeric_limits<int64_t>::max();
  if (job.stop().max_steps() > 0) stop_clock = job.stop().max_steps();
  if (job.stop().epochs() > 0) stop_clock = std::min(stop_clock, job.stop().epochs() * schedule.steps_per_epoch());
  LOG(INFO) << "worker " << rank << " of " << workers << " on " << backend_->name() << ": " << train.size()
            << " training examples, " << schedule.steps_per_epoch() << " steps per epoch, batch " << job.batch_size();

  HostTensors host(*model);
  // Room for a whole global batch: a balanced SYNC job may give this worker any part of it.
  std::vector<float> x(static_cast<size_t>(global_batch) * train.features);
  std::vector<int32_t> y(global_batch);
  TrainerResult result;
  int64_t clock = source_->start_clock();  // also the data position: batches are a function of the clock
  if (clock > 0) LOG(INFO) << "worker " << rank << " starts at clock " << clock;
  double loss_sum = 0;
  int64_t loss_steps = 0, samples_total = 0, samples_window = 0;
  absl::Time window_start = absl::Now();
  int64_t last_eval_clock = -1;

  // Sends a progress report (with an evaluation's result when given); true when the job says stop.
  auto report = [&](const EvalResult* eval) -> absl::StatusOr<bool> {
    tessera::v1::ReportRequest r;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - window_start);
    r.set_train_loss(loss_steps > 0 ? loss_sum / loss_steps : 0.0);
    r.set_samples_per_sec(seconds > 0 ? samples_window / seconds : 0.0);
    r.set_samples(samples_total);
    r.set_epoch(schedule.Epochs(eval != nullptr ? eval->clock : clock));
    r.set_device(backend_->name());
    if (eval != nullptr) {
      r.set_has_eval(true);
      r.set_eval_clock(eval->clock);
      r.set_test_loss(eval->test_loss);
      r.set_test_accuracy(eval->test_accuracy);
      result.test_accuracy = eval->test_accuracy;
      last_eval_clock = eval->clock;
    }
    {
      absl::MutexLock lock(&progress_mu_);
      progress_.train_loss = r.train_loss();
      progress_.samples_per_sec = r.samples_per_sec();
      if (eval != nullptr) progress_.test_accuracy = r.test_accuracy();
    }
    TESSERA_ASSIGN_OR_RETURN(tessera::v1::ReportResponse answer, source_->Report(r));
    loss_sum = 0;
    loss_steps = 0;
    samples_window = 0;
    window_start = absl::Now();
    if (answer.stop() && result.stop_reason.empty()) result.stop_reason = answer.stop_reason();
    return answer.stop();
  };
  // Evaluations finished since the last look, reported; true when the job says stop.
  auto report_evaluations = [&]() -> absl::StatusOr<bool> {
    TESSERA_ASSIGN_OR_RETURN(std::vector<EvalResult> finished, evaluator->Take());
    for (const EvalResult& eval : finished) {
      TESSERA_ASSIGN_OR_RETURN(bool stop, report(&eval));
      if (stop) return true;
    }
    return false;
  };
  absl::Time last_offer = absl::Now();
  int64_t last_offer_clock = -1;

  // The last step's exchange, whose values may still be arriving: the next forward takes them layer by layer
  // as they come (first layer first), so communication overlaps compute.
  std::unique_ptr<StepExchange> previous;
  std::unique_ptr<StepExchange> step;
  const Straggler straggler(options_.straggler, rank);
  absl::Duration last_compute;        // the last step's forward and backward, without waits for values
  absl::Duration waited_for_values;   // this step's waits for the last step's values
  auto take_layer = [&](int layer) -> absl::Status {
    if (!previous) return absl::OkStatus();
    for (int i : {2 * layer, 2 * layer + 1}) {
      const absl::Time wait_start = absl::Now();
      absl::Status waited = previous->WaitValues(i, [&] { return (step && step->stopped()) || stop_->set(); });
      waited_for_values += absl::Now() - wait_start;
      TESSERA_RETURN_IF_ERROR(waited);
      TESSERA_RETURN_IF_ERROR(model->SetParameter(i, host.values[i]));
    }
    return absl::OkStatus();
  };
  // Every value of the last step in place (before an evaluation, a parameter dump or the end).
  auto settle = [&]() -> absl::Status {
    for (int l = 0; previous && l < model->layers(); ++l) TESSERA_RETURN_IF_ERROR(take_layer(l));
    previous.reset();
    return absl::OkStatus();
  };
  bool stopped = false;  // the scheduler ended the job (gate or report) before this worker's last step
  // SYNC: when the job went back to a checkpoint (a server was lost), every step since is void: take the
  // checkpoint's values and go on from its clock (also this worker's data position). True when it did.
  auto take_rollback = [&]() -> bool {
    std::optional<int64_t> to = source_->TakeRollback();
    if (!to) return false;
    LOG(WARNING) << "worker " << rank << ": the job went back to clock " << *to << " (from " << clock
                 << "); training on from there";
    step.reset();
    previous.reset();
    clock = *to;
    absl::MutexLock lock(&progress_mu_);
    progress_.clock = clock;
    return true;
  };
  // Every value from the servers; a rollback that comes meanwhile (the pull is then void) is taken, and the
  // pull made again.
  auto pull_all = [&]() -> absl::Status {
    for (;;) {
      absl::Status pulled = PullInto(*source_, host, *model);
      if (pulled.ok() || !take_rollback()) return pulled;
    }
  };
  auto rolled_back = [&]() -> absl::StatusOr<bool> {
    if (!take_rollback()) return false;
    TESSERA_RETURN_IF_ERROR(pull_all());
    return true;
  };
  TESSERA_RETURN_IF_ERROR(pull_all());
  while (clock < stop_clock) {
    if (absl::Status why = stop_->Get(); !why.ok()) {
      return Annotate(why, absl::StrCat("worker ", rank, " stopped at clock ", clock));
    }
    const BatchSlice slice = source_->batch_slice();
    const std::vector<int64_t> batch =
        slice.count > 0 ? schedule.Slice(clock, slice.offset, slice.count) : schedule.Batch(clock);
    for (size_t i = 0; i < batch.size(); ++i) {
      absl::Span<const float> example = train.Example(batch[i]);
      std::copy(example.begin(), example.end(), x.begin() + i * train.features);
      y[i] = train.y[batch[i]];
    }
    // A straggler on purpose computes longer: its extra time goes before the step (from the last step's
    // compute time, for a slower device), and counts as compute.
    const absl::Time busy_start = absl::Now();
    straggler.Wait(clock, last_compute);
    waited_for_values = absl::ZeroDuration();
    const absl::Time compute_start = absl::Now();
    step = source_->BeginStep(host.names, host.GradSpans(), static_cast<int>(batch.size()), host.ValueSpans());
    // Each layer's gradients leave for the servers while backward goes on with the layers below: the copy to
    // the host starts when backward announces the layer, and the gradient is sent once its copy is in (at
    // once on a CPU; on a GPU the copies run on a stream of their own and are collected as they finish).
    std::deque<std::pair<int, std::unique_ptr<PendingDownload>>> copying;
    auto send_copied = [&](bool wait) -> absl::Status {
      while (!copying.empty() && (wait || copying.front().second->Ready())) {
        TESSERA_RETURN_IF_ERROR(copying.front().second->Wait());
        TESSERA_RETURN_IF_ERROR(step->Send(copying.front().first));
        copying.pop_front();
      }
      return absl::OkStatus();
    };
    auto send_layer = [&](int layer) -> absl::Status {
      for (int i : {2 * layer, 2 * layer + 1}) {
        TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<PendingDownload> download,
                                 model->StartGradientDownload(i, absl::MakeSpan(host.grads[i])));
        copying.emplace_back(i, std::move(download));
      }
      return send_copied(/*wait=*/false);
    };
    LossSums sums;
    absl::Status computed;
    if (options_.simulate_compute_ms > 0) {
      computed = SimulateCompute(*model, options_.simulate_compute_ms, take_layer, send_layer);
    } else {
      const size_t n = batch.size();
      absl::StatusOr<LossSums> result =
          model->ForwardBackward(absl::MakeConstSpan(x).first(n * train.features), absl::MakeConstSpan(y).first(n),
                                 send_layer, take_layer);
      computed = result.status();
      if (result.ok()) sums = *result;
    }
    if (computed.ok()) computed = send_copied(/*wait=*/true);
    last_compute = absl::Now() - compute_start - waited_for_values;
    source_->NoteStep(static_cast<int>(batch.size()), absl::Now() - busy_start - waited_for_values);
    if (!computed.ok()) {
      TESSERA_ASSIGN_OR_RETURN(bool again, rolled_back());
      if (again) continue;
    }
    // A forward that stopped waiting because the job is over ends here, with the clock's stop below.
    if (!computed.ok() && !(computed.code() == absl::StatusCode::kAborted && step->stopped())) return computed;
    absl::StatusOr<ClockResult> finished = step->Finish();
    {
      TESSERA_ASSIGN_OR_RETURN(bool again, rolled_back());
      if (again) continue;
    }
    TESSERA_ASSIGN_OR_RETURN(ClockResult gate, std::move(finished));
    previous = std::move(step);
    loss_sum += sums.loss / batch.size();
    ++loss_steps;
    samples_total += batch.size();
    samples_window += batch.size();
    clock = gate.clock;
    {
      absl::MutexLock lock(&progress_mu_);
      progress_.clock = clock;
      progress_.samples = samples_total;
    }
    if (gate.stop) {
      result.stop_reason = gate.stop_reason;
      stopped = true;
      break;
    }
    if (evaluates) {
      const bool due = clock % job.eval_every_steps() == 0 ||
                       (job.eval_every_seconds() > 0 && absl::Now() - last_offer >= absl::Seconds(job.eval_every_seconds()));
      if (due && clock != last_offer_clock) {
        // The evaluator gets every value of this clock: the last exchange settles first (one step without
        // overlap per evaluation), then training goes on while the copy is scored.
        absl::Status settled = settle();
        if (!settled.ok()) {
          TESSERA_ASSIGN_OR_RETURN(bool again, rolled_back());
          if (again) continue;
        }
        if (absl::IsAborted(settled)) {  // the job ended while this step's round was open
          result.stop_reason = std::string(settled.message());
          stopped = true;
          break;
        }
        TESSERA_RETURN_IF_ERROR(settled);
        evaluator->Offer(clock, host.values);
        last_offer = absl::Now();
        last_offer_clock = clock;
      }
      TESSERA_ASSIGN_OR_RETURN(stopped, report_evaluations());
      if (stopped) break;
    }
    if (clock % job.eval_every_steps() == 0) {
      TESSERA_ASSIGN_OR_RETURN(stopped, report(nullptr));
      if (stopped) break;
    }
  }
  // Rounds the job stopped in may never close: only a job that ran its course waits for its last values.
  if (stopped) {
    previous.reset();
  } else {
    TESSERA_RETURN_IF_ERROR(settle());
  }
  if (result.stop_reason.empty()) result.stop_reason = absl::StrCat("reached step ", clock);
  if (evaluates) {
    // Training is over: evaluations still under way are waited for and reported, and the last values are
    // scored here, on this thread.
    evaluator->Drain();
    TESSERA_RETURN_IF_ERROR(report_evaluations().status());
  }
  if (evaluates && last_eval_clock != clock) {
    // A job stopped mid-step may have left the values partly written: the servers' are scored then.
    if (stopped) TESSERA_RETURN_IF_ERROR(PullInto(*source_, host, *model));
    TESSERA_ASSIGN_OR_RETURN(EvalResult last, evaluator->EvaluateNow(clock, host.values));
    TESSERA_RETURN_IF_ERROR(report(&last).status());
  }
  if (evaluates && !options_.dump_params.empty()) {
    TESSERA_RETURN_IF_ERROR(PullInto(*source_, host, *model));
    NamedTensors tensors;
    for (size_t i = 0; i < host.names.size(); ++i) tensors[host.names[i]] = host.values[i];
    TESSERA_RETURN_IF_ERROR(WriteParamFile(options_.dump_params, tensors));
  }
  TESSERA_RETURN_IF_ERROR(source_->Done());
  result.steps = clock;
  LOG(INFO) << "worker " << rank << " finished after " << clock << " steps: " << result.stop_reason;
  return result;
}

}  // namespace tessera

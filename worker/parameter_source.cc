#include "worker/parameter_source.h"


#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/model/param_init.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"

namespace tessera {
namespace {

// A step run as Push, Clock and Pull when it finishes.
class SerialStep final : public StepExchange {
 public:
  SerialStep(ParameterSource* source, const std::vector<std::string>& names,
             const std::vector<absl::Span<const float>>& grads, int batch_size,
             const std::vector<absl::Span<float>>& out)
      : source_(source), names_(names), grads_(grads), batch_size_(batch_size), out_(out) {}
  absl::Status Send(int) override { return absl::OkStatus(); }
  absl::StatusOr<ClockResult> Finish() override {
    TESSERA_RETURN_IF_ERROR(source_->Push(names_, grads_, batch_size_));
    TESSERA_ASSIGN_OR_RETURN(ClockResult gate, source_->Clock());
    if (!gate.stop) TESSERA_RETURN_IF_ERROR(source_->Pull(names_, out_));
    return gate;
  }

 private:
  ParameterSource* const source_;  // not owned
  const std::vector<std::string>& names_;
  const std::vector<absl::Span<const float>> grads_;
  const int batch_size_;
  const std::vector<absl::Span<float>> out_;
};

}  // namespace

std::unique_ptr<StepExchange> ParameterSource::BeginStep(const std::vector<std::string>& names,
                                                         const std::vector<absl::Span<const float>>& grads,
                                                         int batch_size, const std::vector<absl::Span<float>>& out) {
  return std::make_unique<SerialStep>(this, names, grads, batch_size, out);
}

absl::StatusOr<std::unique_ptr<LocalSource>> LocalSource::Create(const tessera::v1::JobSpec& job,
                                                                 const std::string& run_dir) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RunRecorder> recorder, RunRecorder::Create(run_dir));
  return std::unique_ptr<LocalSource>(new LocalSource(job, std::move(recorder)));
}

absl::Status LocalSource::Declare(const std::vector<tessera::v1::ParameterSpec>& params) {
  for (const auto& p : params) {
    if (params_.count(p.name()) != 0) continue;
    Param& param = params_[p.name()];
    param.values.resize(NumElements(p.shape()));
    param.state.assign(param.values.size() * rule_.state_slots(), 0.0f);
    FillInit(p.init(), p.name(), 0, absl::MakeSpan(param.values));
  }
  return absl::OkStatus();
}

absl::StatusOr<LocalSource::Param*> LocalSource::Find(const std::string& name) {
  auto it = params_.find(name);
  if (it == params_.end()) return absl::NotFoundError(absl::StrCat("unknown parameter '", name, "'"));
  return &it->second;
}

absl::Status LocalSource::Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) {
  for (size_t i = 0; i < names.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(Param * p, Find(names[i]));
    if (out[i].size() != p->values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(names[i], ": expected ", p->values.size(), " values"));
    }
    std::copy(p->values.begin(), p->values.end(), out[i].begin());
  }
  return absl::OkStatus();
}

absl::Status LocalSource::Push(const std::vector<std::string>& names,
                               const std::vector<absl::Span<const float>>& grads, int) {
  for (size_t i = 0; i < names.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(Param * p, Find(names[i]));
    if (grads[i].size() != p->values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(names[i], ": expected ", p->values.size(), " values"));
    }
    TESSERA_RETURN_IF_ERROR(CheckFinite(grads[i], names[i]));
    const int64_t step = ++p->updates;  // this one included; its clock is one less
    rule_.Apply(absl::MakeSpan(p->values), grads[i], absl::MakeSpan(p->state), step, rule_.RateFactor(step - 1),
                1.0f, rule_.Decays(names[i]));
  }
  ++updates_;
  return absl::OkStatus();
}

absl::StatusOr<ClockResult> LocalSource::Clock() {
  ClockResult result;
  result.clock = ++clock_;
  result.min_clock = clock_;
  training_.Note(clock_, absl::Now());
  const int max_seconds = job_.stop().max_seconds();
  if (stop_reason_.empty() && max_seconds > 0 && absl::Now() - start_ >= absl::Seconds(max_seconds)) {
    stop_reason_ = absl::StrCat("ran for stop.max_seconds (", max_seconds, " s)");
  }
  result.stop = !stop_reason_.empty();
  result.stop_reason = stop_reason_;
  return result;
}

absl::StatusOr<tessera::v1::ReportResponse> LocalSource::Report(const tessera::v1::ReportRequest& report) {
  tessera::v1::ReportResponse response;
  if (!report.has_eval()) return response;
  last_eval_ = report;
  EvalRecord record;
  record.step = report.eval_clock() > 0 ? report.eval_clock() : clock_;  // the clock of the values scored
  record.epoch = report.epoch();
  record.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  record.train_loss = report.train_loss();
  record.test_loss = report.test_loss();
  record.test_accuracy = report.test_accuracy();
  record.samples_per_sec = report.samples_per_sec();
  record.updates_applied = updates_;
  if (std::string reached = TargetReachedReason(job_, report.test_accuracy()); !reached.empty() && stop_reason_.empty()) {
    stop_reason_ = std::move(reached);
    seconds_to_target_ = record.wall_seconds;
  }
  TESSERA_RETURN_IF_ERROR(recorder_->Append(record));
  response.set_stop(!stop_reason_.empty());
  response.set_stop_reason(stop_reason_);
  return response;
}

absl::Status LocalSource::Done() {
  RunSummary summary;
  summary.job = job_.name();
  summary.mode = "local";
  summary.workers = 1;
  summary.steps = clock_;
  summary.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  if (last_eval_) summary.SetLastEval(last_eval_->epoch(), last_eval_->test_accuracy(), last_eval_->test_loss());
  summary.target_accuracy = job_.stop().target_accuracy();
  summary.seconds_to_target = seconds_to_target_;
  summary.updates_applied = updates_;
  nlohmann::json json = summary.ToJson();
  json["training"] = training_.ToJson();
  return recorder_->WriteSummary(json);
}

}  // namespace tessera

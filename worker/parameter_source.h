// Where a trainer's parameters live: on the servers (RemoteSource, through PsClient) or in this process
// (LocalSource: the single-process baseline every comparison is made against, using the servers' own update
// rules on whole tensors).
#ifndef TESSERA_WORKER_PARAMETER_SOURCE_H_
#define TESSERA_WORKER_PARAMETER_SOURCE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/daemon/run_recorder.h"
#include "proto/cluster.pb.h"
#include "common/model/update_rule.h"
#include "worker/client/ps_client.h"

namespace tessera {

// Not thread-safe.
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  virtual int rank() const = 0;
  virtual int num_workers() const = 0;
  // The clock to start at: 0, or where a rejoining rank (or a resumed job) goes on; its data position too.
  virtual int64_t start_clock() const { return 0; }
  virtual const tessera::v1::JobSpec& job() const = 0;
  [[nodiscard]] virtual absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params) = 0;
  [[nodiscard]] virtual absl::Status Pull(const std::vector<std::string>& names,
                                          const std::vector<absl::Span<float>>& out) = 0;
  [[nodiscard]] virtual absl::Status Push(const std::vector<std::string>& names,
                                          const std::vector<absl::Span<const float>>& grads, int batch_size) = 0;
  [[nodiscard]] virtual absl::StatusOr<ClockResult> Clock() = 0;
  // One training step: gradients sent parameter by parameter (StepExchange::Send), then Finish() leaves the next
  // step's values in `out` and advances the clock (see PsClient::BeginStep). The default runs Push, Clock and
  // Pull in Finish.
  [[nodiscard]] virtual std::unique_ptr<StepExchange> BeginStep(const std::vector<std::string>& names,
                                                                const std::vector<absl::Span<const float>>& grads,
                                                                int batch_size,
                                                                const std::vector<absl::Span<float>>& out);
  // This worker's part of the global batch of step clock (see PsClient::batch_slice); count 0: the default.
  virtual BatchSlice batch_slice() const { return {}; }
  // The last step's examples and compute time (see PsClient::NoteStep).
  virtual void NoteStep(int samples, absl::Duration busy) {}
  // SYNC: the clock to go on from when the job went back to a checkpoint since the last call (see
  // PsClient::TakeRollback); nullopt otherwise.
  virtual std::optional<int64_t> TakeRollback() { return std::nullopt; }
  // Records progress; the answer's `stop` says the job is over.
  [[nodiscard]] virtual absl::StatusOr<tessera::v1::ReportResponse> Report(
      const tessera::v1::ReportRequest& report) = 0;
  [[nodiscard]] virtual absl::Status Done() = 0;
  // The worker stops on `why`: says so, at once and best effort, to whoever tracks the job.
  virtual void Fail(const absl::Status& why) {}
};

// Parameters on the servers. `client` is owned.
class RemoteSource final : public ParameterSource {
 public:
  explicit RemoteSource(std::unique_ptr<PsClient> client)
      : client_(std::move(client)), start_clock_(client_->clock()) {}
  int rank() const override { return client_->worker_id(); }
  int num_workers() const override { return client_->job().cluster().num_workers(); }
  int64_t start_clock() const override { return start_clock_; }
  const tessera::v1::JobSpec& job() const override { return client_->job(); }
  absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params) override {
    return client_->Declare(params);
  }
  absl::Status Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) override {
    return client_->Pull(names, out);
  }
  absl::Status Push(const std::vector<std::string>& names, const std::vector<absl::Span<const float>>& grads,
                    int batch_size) override {
    return client_->Push(names, grads, batch_size);
  }
  absl::StatusOr<ClockResult> Clock() override { return client_->Clock(); }
  std::unique_ptr<StepExchange> BeginStep(const std::vector<std::string>& names,
                                          const std::vector<absl::Span<const float>>& grads, int batch_size,
                                          const std::vector<absl::Span<float>>& out) override {
    return client_->BeginStep(names, grads, batch_size, out);
  }
  absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& report) override {
    return client_->Report(report);
  }
  absl::Status Done() override { return client_->Done(); }
  void Fail(const absl::Status& why) override { client_->Fail(why); }
  std::optional<int64_t> TakeRollback() override { return client_->TakeRollback(); }
  BatchSlice batch_slice() const override { return client_->batch_slice(); }
  void NoteStep(int samples, absl::Duration busy) override { client_->NoteStep(samples, busy); }

 private:
  std::unique_ptr<PsClient> client_;
  const int64_t start_clock_;
};

// Parameters in this process, updated with the job's UpdateRule; records metrics.jsonl and summary.json itself.
class LocalSource final : public ParameterSource {
 public:
  // `job` must be validated. `run_dir` may be empty (print only).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LocalSource>> Create(const tessera::v1::JobSpec& job,
                                                                           const std::string& run_dir);
  int rank() const override { return 0; }
  int num_workers() const override { return 1; }
  const tessera::v1::JobSpec& job() const override { return job_; }
  absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params) override;
  absl::Status Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) override;
  absl::Status Push(const std::vector<std::string>& names, const std::vector<absl::Span<const float>>& grads,
                    int batch_size) override;
  absl::StatusOr<ClockResult> Clock() override;
  absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& report) override;
  absl::Status Done() override;

 private:
  struct Param {
    std::vector<float> values;
    std::vector<float> state;
    int64_t updates = 0;
  };
  LocalSource(const tessera::v1::JobSpec& job, std::unique_ptr<RunRecorder> recorder)
      : job_(job), rule_(job.optimizer()), recorder_(std::move(recorder)), start_(absl::Now()) {}
  absl::StatusOr<Param*> Find(const std::string& name);

  const tessera::v1::JobSpec job_;
  const UpdateRule rule_;
  const std::unique_ptr<RunRecorder> recorder_;
  const absl::Time start_;
  TrainingSpan training_;  // the steps' own time, for the summary
  std::map<std::string, Param> params_;
  int64_t clock_ = 0;
  int64_t updates_ = 0;
  std::string stop_reason_;
  std::optional<tessera::v1::ReportRequest> last_eval_;
  std::optional<double> seconds_to_target_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_PARAMETER_SOURCE_H_

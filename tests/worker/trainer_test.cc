// Trainer (and its StepLoop) on a CPU backend and synthetic data, with the parameters in this process
// (LocalSource) behind a scripted source that can roll the job back or stop it at a chosen clock.
#include "worker/trainer.h"

#include <optional>
#include <string>
#include <vector>

#include "common/model/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "worker/backend/cpu_backend.h"
#include "worker/parameter_source.h"

namespace tessera::testing {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

tessera::v1::JobSpec LocalJob(int steps) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::SYNC, /*servers=*/1, /*workers=*/1);
  job.mutable_stop()->set_max_steps(steps);
  ApplyJobDefaults(job);
  EXPECT_TRUE(ValidateJobSpec(job).ok());
  return job;
}

// LocalSource with its own clock, which the script can send back (a rollback) or stop. Every step's push is
// recorded with the clock it belongs to; so is every pull.
class ScriptedSource final : public ParameterSource {
 public:
  explicit ScriptedSource(std::unique_ptr<LocalSource> inner) : inner_(std::move(inner)) {}

  // When the clock first reaches `at`, the job goes back to `to` (the step that reached it is void).
  void RollBackAt(int64_t at, int64_t to) { rollback_ = {at, to}; }
  // When the clock reaches `at`, the gate says stop with `why`.
  void StopAt(int64_t at, std::string why) { stop_ = {at, std::move(why)}; }

  const std::vector<int64_t>& pushed_clocks() const { return pushed_clocks_; }
  // Every gradient pushed, in order.
  const std::vector<std::vector<float>>& pushed() const { return pushed_; }
  int pulls() const { return pulls_; }
  bool done() const { return done_; }

  int rank() const override { return 0; }
  int num_workers() const override { return 1; }
  const tessera::v1::JobSpec& job() const override { return inner_->job(); }
  absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params) override {
    return inner_->Declare(params);
  }
  absl::Status Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out) override {
    ++pulls_;
    return inner_->Pull(names, out);
  }
  absl::Status Push(const std::vector<std::string>& names, const std::vector<absl::Span<const float>>& grads,
                    int batch_size) override {
    pushed_clocks_.push_back(clock_);
    for (absl::Span<const float> g : grads) pushed_.emplace_back(g.begin(), g.end());
    return inner_->Push(names, grads, batch_size);
  }
  absl::StatusOr<ClockResult> Clock() override {
    absl::StatusOr<ClockResult> gate = inner_->Clock();
    if (!gate.ok()) return gate;
    gate->clock = ++clock_;
    if (rollback_ && clock_ == rollback_->first) {
      pending_rollback_ = rollback_->second;
      rollback_.reset();
    }
    if (stop_ && clock_ == stop_->first) {
      gate->stop = true;
      gate->stop_reason = stop_->second;
    }
    return gate;
  }
  std::optional<int64_t> TakeRollback() override {
    std::optional<int64_t> to = pending_rollback_;
    if (to) clock_ = *to;
    pending_rollback_.reset();
    return to;
  }
  absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& report) override {
    return inner_->Report(report);
  }
  absl::Status Done() override {
    done_ = true;
    return inner_->Done();
  }

 private:
  std::unique_ptr<LocalSource> inner_;
  int64_t clock_ = 0;
  std::optional<std::pair<int64_t, int64_t>> rollback_;
  std::optional<int64_t> pending_rollback_;
  std::optional<std::pair<int64_t, std::string>> stop_;
  std::vector<int64_t> pushed_clocks_;
  std::vector<std::vector<float>> pushed_;
  int pulls_ = 0;
  bool done_ = false;
};

std::unique_ptr<ScriptedSource> Source(int steps) {
  absl::StatusOr<std::unique_ptr<LocalSource>> local = LocalSource::Create(LocalJob(steps), "");
  EXPECT_TRUE(local.ok()) << local.status();
  return std::make_unique<ScriptedSource>(std::move(*local));
}

// The CPU's arithmetic behind a device's interface: its buffers are not host memory to the step loop, so every
// gradient reaches the host through StartDownload, a block of rows at a time where backward computes blocks.
class DeviceLikeBackend final : public Backend {
 public:
  std::string name() const override { return "device-like cpu"; }
  bool host_memory() const override { return false; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t n) override { return cpu_.Allocate(n); }
  absl::Status Upload(absl::Span<const float> src, Buffer& dst) override { return cpu_.Upload(src, dst); }
  absl::Status Download(const Buffer& src, absl::Span<float> dst) override { return cpu_.Download(src, dst); }
  absl::StatusOr<std::unique_ptr<PendingDownload>> StartDownload(const Buffer& src, size_t offset,
                                                                 absl::Span<float> dst) override {
    if (offset > 0) ++downloads_from_an_offset;
    return cpu_.StartDownload(src, offset, dst);
  }
  bool supports_gemm_rows() const override { return true; }
  absl::Status GemmTransposedRows(int m, int n, int k, const Buffer& a, const Buffer& b, int row_begin, int row_end,
                                  Buffer& c) override {
    return cpu_.GemmTransposedRows(m, n, k, a, b, row_begin, row_end, c);
  }
  absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const Buffer& a,
                    const Buffer& b, float beta, Buffer& c) override {
    return cpu_.Gemm(transpose_a, transpose_b, m, n, k, alpha, a, b, beta, c);
  }
  absl::Status BiasActivation(Buffer& z, const Buffer& bias, int rows, int cols, bool relu) override {
    return cpu_.BiasActivation(z, bias, rows, cols, relu);
  }
  absl::Status ReluBackward(Buffer& grad, const Buffer& activation, size_t n) override {
    return cpu_.ReluBackward(grad, activation, n);
  }
  absl::Status ColumnSum(const Buffer& x, int rows, int cols, Buffer& out) override {
    return cpu_.ColumnSum(x, rows, cols, out);
  }
  absl::StatusOr<LossSums> SoftmaxCrossEntropy(const Buffer& logits, absl::Span<const int32_t> labels, int classes,
                                               float grad_scale, Buffer* grad) override {
    return cpu_.SoftmaxCrossEntropy(logits, labels, classes, grad_scale, grad);
  }

  int downloads_from_an_offset = 0;

 private:
  CpuBackend cpu_;
};

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> out;
  for (int64_t c = from; c < to; ++c) out.push_back(c);
  return out;
}

TEST(TrainerTest, ARunTrainsEveryStepOnceLearnsAndSaysDone) {
  auto source = Source(300);
  CpuBackend backend;
  Trainer trainer(source.get(), &backend, {});
  absl::StatusOr<TrainerResult> result = trainer.Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 300);
  EXPECT_EQ(result->stop_reason, "reached step 300");
  EXPECT_THAT(source->pushed_clocks(), ElementsAreArray(Range(0, 300)));
  // Once at the start, then each step's exchange (push, clock, pull here) brings the next step's values.
  EXPECT_EQ(source->pulls(), 1 + 300);
  // Four synthetic classes: well above chance (0.25).
  EXPECT_GT(result->test_accuracy, 0.6);
  EXPECT_EQ(trainer.progress().clock, 300);
  EXPECT_TRUE(source->done());
}

// On a device backend each weight gradient comes to the host a block of rows at a time, each block leaving once
// its copy is in: the gradients pushed are those of the CPU's own run, bit for bit.
TEST(TrainerTest, GradientsCopiedFromADeviceInBlocksOfRowsArriveWhole) {
  auto on_host = Source(20);
  CpuBackend cpu;
  ASSERT_TRUE(Trainer(on_host.get(), &cpu, {}).Run().ok());
  auto on_device = Source(20);
  DeviceLikeBackend device;
  absl::StatusOr<TrainerResult> result = Trainer(on_device.get(), &device, {}).Run();
  ASSERT_TRUE(result.ok()) << result.status();
  // chunk_bytes 256: blocks of 64 values, so the 32 x 16 first layer comes in 8 blocks.
  EXPECT_GT(device.downloads_from_an_offset, 0);
  ASSERT_EQ(on_device->pushed().size(), on_host->pushed().size());
  for (size_t i = 0; i < on_host->pushed().size(); ++i) {
    ASSERT_EQ(on_device->pushed()[i], on_host->pushed()[i]) << "push " << i;
  }
}

// A job for scripts (no built-in model, or the scripts' own optimizer) is refused before anything is trained.
TEST(TrainerTest, AJobForScriptsIsRefusedNamingWhy) {
  CpuBackend backend;
  tessera::v1::JobSpec job = LocalJob(10);
  job.clear_model();
  absl::StatusOr<std::unique_ptr<LocalSource>> local = LocalSource::Create(job, "");
  ASSERT_TRUE(local.ok()) << local.status();
  absl::StatusOr<TrainerResult> result = Trainer(local->get(), &backend, {}).Run();
  EXPECT_THAT(result.status().message(), HasSubstr("the job names no model"));
  job = LocalJob(10);
  job.mutable_optimizer()->Clear();
  job.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SCRIPT);
  ApplyJobDefaults(job);
  ASSERT_TRUE(ValidateJobSpec(job).ok());
  local = LocalSource::Create(job, "");
  ASSERT_TRUE(local.ok()) << local.status();
  result = Trainer(local->get(), &backend, {}).Run();
  EXPECT_THAT(result.status().message(), HasSubstr("tessera-worker steps the servers' optimizer only"));
}

TEST(TrainerTest, ARollbackVoidsTheStepItLandsInAndTrainingGoesOnFromTheCheckpointsClock) {
  auto source = Source(30);
  source->RollBackAt(/*at=*/12, /*to=*/5);
  CpuBackend backend;
  Trainer trainer(source.get(), &backend, {});
  absl::StatusOr<TrainerResult> result = trainer.Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 30);
  // Steps 0..11 ran, step 11's end brought the rollback: steps 5.. are trained again, each once more.
  std::vector<int64_t> expected = Range(0, 12);
  for (int64_t c : Range(5, 30)) expected.push_back(c);
  EXPECT_THAT(source->pushed_clocks(), ElementsAreArray(expected));
  // Once at the start, once after the rollback, and each step's exchange.
  EXPECT_EQ(source->pulls(), 2 + static_cast<int>(expected.size()));
}

TEST(TrainerTest, TheGatesStopEndsTheRunWithItsReason) {
  auto source = Source(100);
  source->StopAt(7, "target accuracy reached");
  CpuBackend backend;
  Trainer trainer(source.get(), &backend, {});
  absl::StatusOr<TrainerResult> result = trainer.Run();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->steps, 7);
  EXPECT_EQ(result->stop_reason, "target accuracy reached");
  EXPECT_TRUE(source->done());
}

TEST(TrainerTest, CancelledBeforeAStepTheRunEndsCancelledNamingTheClock) {
  auto source = Source(100);
  CpuBackend backend;
  Trainer trainer(source.get(), &backend, {});
  trainer.Cancel("the worker was told to stop");
  absl::StatusOr<TrainerResult> result = trainer.Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("stopped at clock 0"));
  EXPECT_TRUE(source->pushed_clocks().empty());
  EXPECT_FALSE(source->done());
}

}  // namespace
}  // namespace tessera::testing

#include "common/model/job_spec.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

tessera::v1::JobSpec ParseValid(const std::string& text) {
  absl::StatusOr<tessera::v1::JobSpec> job = ParseJobSpec(text, "job.pbtxt");
  EXPECT_THAT(job, IsOk());
  ApplyJobDefaults(*job);
  return *job;
}

TEST(JobSpecTest, DefaultsFillTheDebianDataSetAndSgd) {
  tessera::v1::JobSpec job = ParseValid("model { mlp { hidden_sizes: 8 } } stop { max_steps: 3 }");
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
  EXPECT_EQ(job.data().train_images(), std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
  EXPECT_EQ(job.optimizer().kind(), tessera::v1::OptimizerSpec::SGD);
  EXPECT_EQ(job.consistency().mode(), tessera::v1::ConsistencySpec::SYNC);
  EXPECT_EQ(job.batch_size(), 64);
  EXPECT_EQ(job.chunk_bytes(), 65536);
}

TEST(JobSpecTest, SyntaxErrorNamesTheLine) {
  EXPECT_THAT(ParseJobSpec("name: \"x\"\nmodel { mlp { hidden_sizes: 8 }\nbatch_size: }\n", "bad.pbtxt"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad.pbtxt: line 3"));
}

TEST(JobSpecTest, UnknownFieldNamesTheLineAndField) {
  absl::StatusOr<tessera::v1::JobSpec> job = ParseJobSpec("name: \"x\"\nbatchsize: 3\n", "job.pbtxt");
  EXPECT_THAT(job, StatusIs(absl::StatusCode::kInvalidArgument, "line 2"));
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("batchsize"));
}

TEST(JobSpecTest, JsonIsAccepted) {
  absl::StatusOr<tessera::v1::JobSpec> job =
      ParseJobSpec(R"({"model": {"mlp": {"hiddenSizes": [4]}}, "stop": {"maxSteps": 2}})", "job.json");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->stop().max_steps(), 2);
}

TEST(JobSpecTest, UcxNeedsATrustedNetwork) {
  tessera::v1::JobSpec job = ParseValid("model { mlp { hidden_sizes: 8 } } stop { max_steps: 3 }");
  job.set_transport(tessera::v1::UCX);
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "trusted_network: true"));
  job.set_trusted_network(true);
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
}

TEST(JobSpecTest, WirePrecisionsParseAndTopKIsAFraction) {
  tessera::v1::JobSpec job = ParseValid(
      "model { mlp { hidden_sizes: 8 } } stop { max_steps: 3 } wire { gradients: BF16 values: FP16 }");
  EXPECT_EQ(job.wire().gradients(), tessera::v1::WireSpec::BF16);
  EXPECT_EQ(job.wire().values(), tessera::v1::WireSpec::FP16);
  job.mutable_wire()->set_gradient_top_k(0.01f);
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
  job.mutable_wire()->set_gradient_top_k(0.6f);
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "wire.gradient_top_k"));
  job.mutable_wire()->set_gradient_top_k(-0.1f);
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "wire.gradient_top_k"));
}

TEST(JobSpecTest, StalenessOutsideSspIsAContradiction) {
  tessera::v1::JobSpec job = ParseValid(
      "model { softmax_regression {} } stop { max_steps: 3 } consistency { mode: SYNC staleness: 2 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "consistency.staleness"));
}

TEST(JobSpecTest, BalanceAndBackupWorkersAreSyncOptionsWithTheirLimits) {
  const std::string base = "model { softmax_regression {} } stop { max_steps: 3 } cluster { num_workers: 2 } ";
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SYNC balance: THROUGHPUT backup_workers: 1 }")),
              IsOk());
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: ASYNC balance: THROUGHPUT }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "consistency.balance"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SYNC balance: FIXED shares: [1] }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "consistency.shares"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SYNC balance: FIXED shares: [1, -1] }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "consistency.shares"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SYNC backup_workers: 2 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "consistency.backup_workers"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SSP staleness: 1 backup_workers: 1 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "consistency.backup_workers"));
  EXPECT_EQ(ParseValid(base).consistency().async_momentum(), tessera::v1::ConsistencySpec::CORRECTED);
}

TEST(JobSpecTest, DelayCompensationIsAnAsyncOptionForGradients) {
  const std::string base = "model { softmax_regression {} } stop { max_steps: 3 } cluster { num_workers: 2 } ";
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: ASYNC delay_compensation: 0.04 }")), IsOk());
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SSP staleness: 2 delay_compensation: 1 }")),
              IsOk());
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: SYNC delay_compensation: 0.04 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "applies to ASYNC and SSP only"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: ASYNC delay_compensation: -1 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite lambda >= 0"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "consistency { mode: ASYNC delay_compensation: inf }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "finite lambda >= 0"));
  EXPECT_THAT(ValidateJobSpec(ParseValid(base + "optimizer { kind: SCRIPT } consistency { mode: ASYNC "
                                                "delay_compensation: 0.04 }")),
              StatusIs(absl::StatusCode::kInvalidArgument, "not with optimizer SCRIPT"));
}

TEST(JobSpecTest, OverridesReplaceFieldsAndWholeListsAndRejectUnknownFields) {
  tessera::v1::JobSpec job = ParseValid(
      "model { mlp { hidden_sizes: [8, 4] } } stop { max_steps: 3 } optimizer { learning_rate: 0.1 momentum: 0.9 }");
  ASSERT_THAT(MergeJobOverrides("optimizer { momentum: 0.5 } model { mlp { hidden_sizes: [16] } }", job), IsOk());
  EXPECT_FLOAT_EQ(job.optimizer().momentum(), 0.5f);
  EXPECT_FLOAT_EQ(job.optimizer().learning_rate(), 0.1f) << "fields not named keep their value";
  EXPECT_EQ(job.model().mlp().hidden_sizes_size(), 1);
  ASSERT_THAT(MergeJobOverrides("consistency { mode: ASYNC } consistency { async_momentum: AS_GIVEN }", job), IsOk());
  EXPECT_EQ(job.consistency().mode(), tessera::v1::ConsistencySpec::ASYNC);
  EXPECT_EQ(job.consistency().async_momentum(), tessera::v1::ConsistencySpec::AS_GIVEN);
  EXPECT_THAT(MergeJobOverrides("optimizer { nesterov: true }", job),
              StatusIs(absl::StatusCode::kInvalidArgument, "nesterov"));
  EXPECT_FLOAT_EQ(job.optimizer().momentum(), 0.5f) << "a failed override changes nothing";
  ASSERT_THAT(MergeJobOverrides("optimizer { momentum: 0 }", job), IsOk());
  EXPECT_EQ(job.optimizer().momentum(), 0.0f) << "a zero named in the overrides is taken";
  EXPECT_FLOAT_EQ(job.optimizer().learning_rate(), 0.1f);
}

TEST(JobSpecTest, MomentumWithAdamIsAContradiction) {
  tessera::v1::JobSpec job =
      ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { kind: ADAM momentum: 0.9 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "optimizer.momentum"));
}

// AdamW decays by 0.01 unless told (as torch.optim.AdamW); a decaying schedule ends at stop.max_steps unless
// told, and one that cannot end after its warmup is refused naming the field.
TEST(JobSpecTest, AdamwAndSchedulesTakeTheirDefaultsAndRefuseWhatCannotRun) {
  tessera::v1::JobSpec job = ParseValid(
      "model { softmax_regression {} } stop { max_steps: 300 } optimizer { kind: ADAMW schedule { kind: COSINE "
      "warmup_steps: 10 } }");
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
  EXPECT_FLOAT_EQ(job.optimizer().weight_decay(), 0.01f);
  EXPECT_FLOAT_EQ(job.optimizer().learning_rate(), 0.001f);
  EXPECT_EQ(job.optimizer().schedule().total_steps(), 300);
  EXPECT_FLOAT_EQ(ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { kind: ADAMW "
                             "weight_decay: 0 }").optimizer().weight_decay(), 0.0f);
  job = ParseValid("model { softmax_regression {} } stop { epochs: 3 } optimizer { schedule { kind: LINEAR } }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "optimizer.schedule.total_steps"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { schedule { kind: STEP } }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "step_every"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { weight_decay: -1 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "optimizer.weight_decay"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } cluster { worker_errors: AWAIT_RESTART }");
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { clip_global_norm: -1 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "optimizer.clip_global_norm"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { clip_global_norm: 1 } "
                   "cluster { num_workers: 3 } consistency { mode: SYNC backup_workers: 1 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "not with backup workers"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { clip_global_norm: 1 }");
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
}

// SCRIPT leaves the optimizer to the workers: any server optimizer field beside it is refused, and the internal
// ROUND_MEAN is not for job files.
TEST(JobSpecTest, TheScriptsOptimizerTakesNoServerOptimizerFields) {
  tessera::v1::JobSpec job =
      ParseValid("model { softmax_regression {} } stop { max_steps: 300 } optimizer { kind: SCRIPT }");
  EXPECT_THAT(ValidateJobSpec(job), IsOk());
  EXPECT_EQ(job.optimizer().schedule().total_steps(), 0) << "no schedule runs on the servers";
  for (const char* field : {"learning_rate: 0.1", "momentum: 0.9", "weight_decay: 0.01", "no_decay: \"bias\"",
                            "schedule { warmup_steps: 10 }", "beta1: 0.8", "clip_global_norm: 1"}) {
    job = ParseValid(absl::StrCat("model { softmax_regression {} } stop { max_steps: 3 } optimizer { kind: SCRIPT ",
                                  field, " }"));
    EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "the script's")) << field;
  }
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 3 } optimizer { kind: ROUND_MEAN }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "write SCRIPT"));
}

// A job for scripts names only what the servers need: no model, no data (the default is Fashion-MNIST's files),
// and with SCRIPT no optimizer settings.
TEST(JobSpecTest, AScriptsJobNeedsNoModel) {
  EXPECT_THAT(ValidateJobSpec(ParseValid("stop { max_steps: 3 } optimizer { kind: SCRIPT }")), IsOk());
}

TEST(JobSpecTest, MissingStopConditionNamesTheField) {
  tessera::v1::JobSpec job = ParseValid("model { softmax_regression {} }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "job field stop"));
}

TEST(JobSpecTest, OutOfRangeValuesNameTheField) {
  tessera::v1::JobSpec job = ParseValid("model { mlp { hidden_sizes: [8, -1] } } stop { max_steps: 1 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "model.mlp.hidden_sizes[1]"));
  job = ParseValid("model { softmax_regression {} } stop { target_accuracy: 1.5 }");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "stop.target_accuracy"));
  job = ParseValid("model { softmax_regression {} } stop { max_steps: 1 } chunk_bytes: 2");
  EXPECT_THAT(ValidateJobSpec(job), StatusIs(absl::StatusCode::kInvalidArgument, "chunk_bytes"));
}

TEST(JobSpecTest, LoadReportsAMissingFile) {
  EXPECT_THAT(LoadJobSpec("/nonexistent/job.pbtxt"), StatusIs(absl::StatusCode::kNotFound, "/nonexistent/job.pbtxt"));
}

// A job is refused at validation when what it asks every worker to allocate is beyond the limits, naming the
// field: a model too large, layers too wide for the batch, too many classes, too large a global batch or data set.
TEST(JobSpecTest, WhatNoWorkerCouldAllocateIsRefusedNamingTheField) {
  const std::string base = "name: \"big\" ";
  const std::string data = "data { format: SYNTHETIC synthetic_features: 64 synthetic_classes: 10 } ";
  const std::string batch = "batch_size: 32 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {batch + data + "model { mlp { hidden_sizes: [1048576, 1048576] } }", "model.mlp.hidden_sizes"},
      {batch + data + "model { mlp { hidden_sizes: [65536, 65536] } }", "model.mlp.hidden_sizes[1]"},
      {batch + "model { mlp { hidden_sizes: 16 } } data { format: SYNTHETIC synthetic_classes: 2147483647 }",
       "data.synthetic_classes"},
      {batch + "model { mlp { hidden_sizes: 16 } } data { format: SYNTHETIC synthetic_features: 1048576 "
       "synthetic_classes: 10 synthetic_train_examples: 1048576 }",
       "data.synthetic_train_examples"},
      {data + "model { mlp { hidden_sizes: 16 } } cluster { num_workers: 64 } batch_size: 65536", "batch_size"},
  };
  for (const auto& [extra, field] : cases) {
    absl::StatusOr<tessera::v1::JobSpec> job = ParseJobSpec(absl::StrCat(base, extra), "test");
    ASSERT_TRUE(job.ok()) << job.status();
    ApplyJobDefaults(*job);
    const absl::Status valid = ValidateJobSpec(*job);
    EXPECT_EQ(valid.code(), absl::StatusCode::kInvalidArgument) << extra << ": " << valid;
    EXPECT_NE(valid.message().find(field), std::string::npos) << extra << ": " << valid;
  }
  // The worker's own data (IDX: the input width is known only there) is checked the same way.
  absl::StatusOr<tessera::v1::JobSpec> idx = ParseJobSpec(R"(
name: "idx"
model { mlp { hidden_sizes: [1024, 1024] } }
data { format: IDX }
batch_size: 32
)", "test");
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_TRUE(CheckModelSize(*idx, 0, 0).ok());
  EXPECT_TRUE(CheckModelSize(*idx, 784, 10).ok());
  EXPECT_EQ(CheckModelSize(*idx, 1 << 20, 10).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera

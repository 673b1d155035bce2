#include "worker/worker_options.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

TEST(WorkerOptionsTest, AcceptsClusterAndLocalModes) {
  WorkerOptions cluster;
  cluster.scheduler_address = "127.0.0.1:7000";
  EXPECT_THAT(ValidateWorkerOptions(cluster), IsOk());
  cluster.device = "cuda:3";
  EXPECT_THAT(ValidateWorkerOptions(cluster), IsOk());
  WorkerOptions local;
  local.local = true;
  local.job_path = "job.pbtxt";
  EXPECT_THAT(ValidateWorkerOptions(local), IsOk());
}

TEST(WorkerOptionsTest, NamesTheFlagAtFault) {
  WorkerOptions options;
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--scheduler"));
  options.scheduler_address = "no-port";
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--scheduler"));
  options.scheduler_address = "127.0.0.1:7000";
  options.device = "tpu:0";
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--device"));
  options.device = "cuda:";
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--device"));
  options.device = "cpu";
  options.job_path = "job.pbtxt";
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--job is for --local"));
  options.local = true;
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "contradict"));
  options.scheduler_address.clear();
  options.job_path.clear();
  EXPECT_THAT(ValidateWorkerOptions(options), StatusIs(absl::StatusCode::kInvalidArgument, "--local needs --job"));
}

}  // namespace
}  // namespace tessera

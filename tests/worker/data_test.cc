#include <algorithm>
#include <set>

#include "common/model/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/data/batch_schedule.h"
#include "worker/data/dataset.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;

TEST(BatchScheduleTest, WorkerBatchesPartitionTheGlobalBatchOfOneProcess) {
  BatchSchedule local(1000, 24, 1, 0, 9);
  BatchSchedule w0(1000, 8, 3, 0, 9), w1(1000, 8, 3, 1, 9), w2(1000, 8, 3, 2, 9);
  for (int64_t step = 0; step < 100; ++step) {  // crosses several epochs
    std::vector<int64_t> together = w0.Batch(step);
    for (int64_t i : w1.Batch(step)) together.push_back(i);
    for (int64_t i : w2.Batch(step)) together.push_back(i);
    ASSERT_EQ(together, local.Batch(step)) << "step " << step;
  }
}

TEST(BatchScheduleTest, AnEpochVisitsDistinctExamplesAndEpochsReshuffle) {
  BatchSchedule s(100, 10, 1, 0, 1);
  ASSERT_EQ(s.steps_per_epoch(), 10);
  std::set<int64_t> seen;
  for (int step = 0; step < 10; ++step) {
    for (int64_t i : s.Batch(step)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_NE(s.Batch(0), s.Batch(10));
}

TEST(DatasetTest, MissingDebianDataSetNamesThePackage) {
  tessera::v1::DataSpec spec;
  spec.set_format(tessera::v1::DataSpec::IDX);
  spec.set_train_images(std::string(kFashionMnistDir) + "/no-such-images-idx3-ubyte.gz");
  spec.set_train_labels(std::string(kFashionMnistDir) + "/no-such-labels-idx1-ubyte.gz");
  absl::StatusOr<Dataset> data = LoadSplit(spec, /*train=*/true, 1);
  EXPECT_THAT(data, StatusIs(absl::StatusCode::kNotFound, "dataset-fashion-mnist"));
  EXPECT_THAT(data, StatusIs(absl::StatusCode::kNotFound, "no-such-images"));
}

TEST(DatasetTest, SyntheticSplitsShareCentresAndDiffer) {
  Dataset train = MakeSynthetic(50, 4, 3, 5, true), test = MakeSynthetic(50, 4, 3, 5, false);
  EXPECT_EQ(train.size(), 50);
  EXPECT_EQ(train.features, 4);
  EXPECT_NE(train.x, test.x);
  EXPECT_TRUE(std::all_of(train.y.begin(), train.y.end(), [](int32_t y) { return y >= 0 && y < 3; }));
}

TEST(DatasetTest, FashionMnistLoadsWhenInstalled) {
  const std::string dir = kFashionMnistDir;
  absl::StatusOr<Dataset> test = LoadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  if (test.status().code() == absl::StatusCode::kNotFound) GTEST_SKIP() << test.status();
  ASSERT_THAT(test, IsOk());
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->features, 784);
  EXPECT_EQ(test->classes, 10);
  EXPECT_TRUE(std::all_of(test->x.begin(), test->x.end(), [](float v) { return v >= 0 && v <= 1; }));
}

}  // namespace
}  // namespace tessera

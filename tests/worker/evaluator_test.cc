#include "worker/evaluator.h"

#include "absl/time/clock.h"
#include "common/base/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;

// What the evaluator's thread reports for values of a clock is what a model of its own gives on them, and it
// names the clock; the newest values offered while one evaluation runs are the next evaluated.
TEST(EvaluatorTest, ScoresOfferedValuesOffTheCallersThreadWithTheirClock) {
  const Dataset test = MakeSynthetic(500, 8, 3, 5, /*train=*/false);
  const std::vector<int> sizes = {8, 16, 3};
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_THAT(backend, IsOk());
  absl::StatusOr<std::unique_ptr<Mlp>> model = Mlp::Create(backend->get(), sizes, /*seed=*/3, 1000);
  ASSERT_THAT(model, IsOk());
  std::vector<std::vector<float>> values;
  for (int i = 0; i < (*model)->num_parameters(); ++i) {
    values.emplace_back(NumElements((*model)->parameters()[i].shape()));
    ASSERT_THAT((*model)->GetParameter(i, absl::MakeSpan(values.back())), IsOk());
  }
  absl::StatusOr<LossSums> expected = (*model)->Evaluate(test.x, test.y);
  ASSERT_THAT(expected, IsOk());

  absl::StatusOr<std::unique_ptr<Evaluator>> evaluator = Evaluator::Create(sizes, test, /*seed=*/99);
  ASSERT_THAT(evaluator, IsOk());
  (*evaluator)->Offer(40, values);
  absl::StatusOr<std::vector<EvalResult>> results;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  do {
    results = (*evaluator)->Take();
    ASSERT_THAT(results, IsOk());
    if (results->empty()) absl::SleepFor(absl::Milliseconds(10));  // the evaluator's thread is scoring
  } while (results->empty() && absl::Now() < deadline);
  ASSERT_EQ(results->size(), 1u) << "no result within 60 s";
  EXPECT_EQ((*results)[0].clock, 40);
  EXPECT_DOUBLE_EQ((*results)[0].test_accuracy, static_cast<double>(expected->correct) / test.size());
  EXPECT_NEAR((*results)[0].test_loss, expected->loss / test.size(), 1e-9);
  results = (*evaluator)->Take();
  ASSERT_THAT(results, IsOk());
  EXPECT_TRUE(results->empty()) << "each result is taken once";
}

}  // namespace
}  // namespace tessera

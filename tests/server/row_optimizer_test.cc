// Sparse-table row optimizers against their reference formulas (computed here in double precision), and the
// summing of duplicate ids.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "common/base/row_batch.h"
#include "server/tables/row_optimizer.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using Kind = RowOptimizerSpec::Kind;

// Three steps of gradients for one row of dim 3.
const std::vector<std::vector<double>> kGrads = {{0.5, -1.0, 0.25}, {0.1, 0.3, -2.0}, {-0.4, 0.0, 0.7}};
const std::vector<double> kStart = {0.2, -0.1, 0.05};

// Runs `spec` over kGrads from kStart; returns the row after each step.
std::vector<std::vector<float>> Train(const RowOptimizerSpec& spec) {
  RowOptimizer optimizer(spec);
  std::vector<float> w(kStart.begin(), kStart.end());
  std::vector<float> state(optimizer.StateFloats(3));
  optimizer.InitState(absl::MakeSpan(state));
  std::vector<std::vector<float>> after;
  for (size_t t = 0; t < kGrads.size(); ++t) {
    std::vector<float> g(kGrads[t].begin(), kGrads[t].end());
    optimizer.Apply(absl::MakeSpan(w), absl::MakeSpan(state), g, static_cast<int64_t>(t + 1));
    after.push_back(w);
  }
  return after;
}

void ExpectNear(const std::vector<std::vector<float>>& got, const std::vector<std::vector<double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    for (size_t i = 0; i < got[t].size(); ++i) {
      EXPECT_NEAR(got[t][i], want[t][i], 1e-6 * std::max(1.0, std::abs(want[t][i]))) << "step " << t + 1 << ", " << i;
    }
  }
}

TEST(RowOptimizerTest, SgdStepsAgainstTheGradient) {
  RowOptimizerSpec spec;
  spec.learning_rate = 0.1f;
  std::vector<std::vector<double>> want;
  std::vector<double> w = kStart;
  for (const auto& g : kGrads) {
    for (int i = 0; i < 3; ++i) w[i] -= 0.1 * g[i];
    want.push_back(w);
  }
  EXPECT_EQ(RowOptimizer(spec).StateFloats(3), 0);
  ExpectNear(Train(spec), want);
}

TEST(RowOptimizerTest, AdagradKeepsOneAccumulatorPerCoordinate) {
  RowOptimizerSpec spec;
  spec.kind = Kind::kAdagrad;
  spec.learning_rate = 0.1f;
  spec.initial_accumulator = 0.1f;
  spec.epsilon = 1e-6f;
  std::vector<std::vector<double>> want;
  std::vector<double> w = kStart;
  std::vector<double> a(3, 0.1);
  for (const auto& g : kGrads) {
    for (int i = 0; i < 3; ++i) {
      a[i] += g[i] * g[i];
      w[i] -= 0.1 * g[i] / (std::sqrt(a[i]) + 1e-6);
    }
    want.push_back(w);
  }
  EXPECT_EQ(RowOptimizer(spec).StateFloats(3), 3);
  ExpectNear(Train(spec), want);
}

TEST(RowOptimizerTest, RowwiseAdagradKeepsOneAccumulatorPerRowOfTheMeanSquare) {
  RowOptimizerSpec spec;
  spec.kind = Kind::kRowwiseAdagrad;
  spec.learning_rate = 0.1f;
  spec.epsilon = 1e-6f;
  std::vector<std::vector<double>> want;
  std::vector<double> w = kStart;
  double a = 0;
  for (const auto& g : kGrads) {
    a += (g[0] * g[0] + g[1] * g[1] + g[2] * g[2]) / 3;
    for (int i = 0; i < 3; ++i) w[i] -= 0.1 * g[i] / (std::sqrt(a) + 1e-6);
    want.push_back(w);
  }
  EXPECT_EQ(RowOptimizer(spec).StateFloats(3), 1);
  ExpectNear(Train(spec), want);
}

TEST(RowOptimizerTest, FtrlProximalFollowsTheClosedFormAndL1MakesExactZeros) {
  RowOptimizerSpec spec;
  spec.kind = Kind::kFtrl;
  spec.learning_rate = 0.5f;  // alpha
  spec.ftrl_beta = 1.0f;
  spec.l1 = 0.3f;
  spec.l2 = 0.1f;
  std::vector<std::vector<double>> want;
  std::vector<double> w = kStart;
  std::vector<double> z(3, 0), n(3, 0);
  for (const auto& g : kGrads) {
    for (int i = 0; i < 3; ++i) {
      const double sigma = (std::sqrt(n[i] + g[i] * g[i]) - std::sqrt(n[i])) / 0.5;
      z[i] += g[i] - sigma * w[i];
      n[i] += g[i] * g[i];
      w[i] = std::abs(z[i]) <= 0.3 ? 0.0 : -(z[i] - std::copysign(0.3, z[i])) / ((1.0 + std::sqrt(n[i])) / 0.5 + 0.1);
    }
    want.push_back(w);
  }
  const std::vector<std::vector<float>> got = Train(spec);
  ExpectNear(got, want);
  // Coordinate 2's first gradient (0.25, with z = 0.25 - sigma * 0.05) stays within l1: exactly zero, not small.
  EXPECT_EQ(got[0][2], 0.0f);
  EXPECT_NE(got[0][1], 0.0f);
}

TEST(RowOptimizerTest, LazyAdamCorrectsBiasWithTheRowsOwnStepCount) {
  RowOptimizerSpec spec;
  spec.kind = Kind::kLazyAdam;
  spec.learning_rate = 0.01f;
  spec.beta1 = 0.9f;
  spec.beta2 = 0.999f;
  spec.epsilon = 1e-8f;
  std::vector<std::vector<double>> want;
  std::vector<double> w = kStart;
  std::vector<double> m(3, 0), v(3, 0);
  const double b1 = 0.9f, b2 = 0.999f;  // as the float spec holds them
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    const auto& g = kGrads[t - 1];
    for (int i = 0; i < 3; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= 0.01 * (m[i] / (1 - std::pow(b1, t))) / (std::sqrt(v[i] / (1 - std::pow(b2, t))) + 1e-8);
    }
    want.push_back(w);
  }
  ExpectNear(Train(spec), want);

  // A row's first update moves each coordinate by about the learning rate whatever the global step is: the bias
  // correction counts the row's own updates.
  RowOptimizer optimizer(spec);
  std::vector<float> row = {0.0f};
  std::vector<float> state(optimizer.StateFloats(1));
  optimizer.Apply(absl::MakeSpan(row), absl::MakeSpan(state), std::vector<float>{3.0f}, /*step=*/1);
  EXPECT_NEAR(row[0], -0.01f, 1e-6);
}

TEST(RowOptimizerTest, SpecsNoRowCanTrainWithAreRefusedNamingTheField) {
  RowOptimizerSpec spec;
  EXPECT_THAT(RowOptimizer::Validate(spec), IsOk());
  spec.learning_rate = -1;
  EXPECT_THAT(RowOptimizer::Validate(spec), StatusIs(absl::StatusCode::kInvalidArgument, "learning_rate"));
  spec = RowOptimizerSpec();
  spec.l1 = std::nanf("");
  EXPECT_THAT(RowOptimizer::Validate(spec), StatusIs(absl::StatusCode::kInvalidArgument, "l1"));
  spec = RowOptimizerSpec();
  spec.beta2 = 1.0f;
  EXPECT_THAT(RowOptimizer::Validate(spec), StatusIs(absl::StatusCode::kInvalidArgument, "beta2"));
  spec = RowOptimizerSpec();
  spec.kind = Kind::kFtrl;
  spec.learning_rate = 0;
  EXPECT_THAT(RowOptimizer::Validate(spec), StatusIs(absl::StatusCode::kInvalidArgument, "alpha"));
}

TEST(RowBatchTest, DuplicateIdsAreSummedOnceEachInAscendingOrder) {
  const std::vector<uint64_t> ids = {7, 3, 7, 1ull << 63};
  const std::vector<float> grads = {1, 2, 10, 20, 100, 200, 5, 6};
  absl::StatusOr<RowGradients> summed = SumDuplicates(ids, grads, 2);
  ASSERT_THAT(summed.status(), IsOk());
  EXPECT_EQ(summed->ids, (std::vector<uint64_t>{3, 7, 1ull << 63}));
  EXPECT_EQ(summed->grads, (std::vector<float>{10, 20, 101, 202, 5, 6}));
  EXPECT_EQ(summed->duplicates, 1);
}

TEST(RowBatchTest, TheSumsDoNotDependOnTheOrderOfTheBatch) {
  // Values whose float sum depends on the order it is taken in: (1e8 + 1) - 1e8 is 0, 1e8 - 1e8 + 1 is 1.
  std::vector<uint64_t> ids = {5, 5, 5, 9};
  std::vector<float> grads = {1e8f, 1.0f, -1e8f, 0.5f};
  std::vector<size_t> order = {0, 1, 2, 3};
  std::vector<float> first;
  do {
    std::vector<uint64_t> shuffled_ids;
    std::vector<float> shuffled;
    for (size_t k : order) {
      shuffled_ids.push_back(ids[k]);
      shuffled.push_back(grads[k]);
    }
    absl::StatusOr<RowGradients> summed = SumDuplicates(shuffled_ids, shuffled, 1);
    ASSERT_THAT(summed.status(), IsOk());
    if (first.empty()) first = summed->grads;
    EXPECT_EQ(std::memcmp(summed->grads.data(), first.data(), first.size() * sizeof(float)), 0);
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(RowBatchTest, ALargeBatchIsSummedAsTheDefinitionSays) {
  // Ids that differ in every byte (and share some bytes), many repeated: each id once, ascending, its rows summed
  // in the order of their bit patterns, against that definition written out with a map.
  std::mt19937_64 rng(5);
  const int64_t dim = 3;
  std::vector<uint64_t> pool;
  for (int i = 0; i < 3000; ++i) pool.push_back(i % 3 == 0 ? rng() : (rng() & 0xFF00FF) | (uint64_t{7} << 56));
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  for (int i = 0; i < 20000; ++i) {
    ids.push_back(pool[rng() % pool.size()]);
    for (int64_t d = 0; d < dim; ++d) grads.push_back(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 7.0f);
  }
  std::map<uint64_t, std::vector<std::vector<float>>> rows;
  for (size_t i = 0; i < ids.size(); ++i) rows[ids[i]].emplace_back(grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
  std::vector<uint64_t> want_ids;
  std::vector<float> want;
  for (auto& [id, of_id] : rows) {
    std::sort(of_id.begin(), of_id.end(), [](const std::vector<float>& a, const std::vector<float>& b) {
      for (size_t d = 0; d < a.size(); ++d) {
        uint32_t x, y;
        std::memcpy(&x, &a[d], 4);
        std::memcpy(&y, &b[d], 4);
        if (x != y) return x < y;
      }
      return false;
    });
    std::vector<float> sum = of_id[0];
    for (size_t k = 1; k < of_id.size(); ++k) {
      for (int64_t d = 0; d < dim; ++d) sum[d] += of_id[k][d];
    }
    want_ids.push_back(id);
    want.insert(want.end(), sum.begin(), sum.end());
  }
  absl::StatusOr<RowGradients> summed = SumDuplicates(ids, grads, dim);
  ASSERT_THAT(summed.status(), IsOk());
  EXPECT_EQ(summed->ids, want_ids);
  ASSERT_EQ(summed->grads.size(), want.size());
  EXPECT_EQ(std::memcmp(summed->grads.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(summed->duplicates, static_cast<int64_t>(ids.size() - want_ids.size()));
}

TEST(RowBatchTest, ABatchAlreadySummedIsTakenOverAndAnyOtherIsSummed) {
  RowGradients ascending;
  ascending.ids = {3, 7, 1ull << 63};
  ascending.grads = {1, 2, 3, 4, 5, 6};
  const float* storage = ascending.grads.data();
  absl::StatusOr<RowGradients> taken = SumDuplicates(std::move(ascending), 2);
  ASSERT_THAT(taken.status(), IsOk());
  EXPECT_EQ(taken->grads.data(), storage) << "copied";
  EXPECT_EQ(taken->ids, (std::vector<uint64_t>{3, 7, 1ull << 63}));
  EXPECT_EQ(taken->duplicates, 0);
  // Not ascending, or an id twice: summed as the other form sums it.
  for (std::vector<uint64_t> ids : {std::vector<uint64_t>{7, 3, 7}, std::vector<uint64_t>{3, 7, 7}}) {
    RowGradients batch;
    batch.ids = ids;
    batch.grads = {1, 2, 10, 20, 100, 200};
    absl::StatusOr<RowGradients> summed = SumDuplicates(batch, 2);
    absl::StatusOr<RowGradients> reference = SumDuplicates(absl::MakeConstSpan(ids), batch.grads, 2);
    ASSERT_THAT(summed.status(), IsOk());
    EXPECT_EQ(summed->ids, reference->ids);
    EXPECT_EQ(summed->grads, reference->grads);
    EXPECT_EQ(summed->duplicates, 1);
  }
  RowGradients short_batch;
  short_batch.ids = {1, 2};
  short_batch.grads = {1, 2, 3};
  EXPECT_THAT(SumDuplicates(std::move(short_batch), 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "4 expected"));
}

TEST(RowBatchTest, ABatchOfTheWrongShapeIsRefused) {
  EXPECT_THAT(SumDuplicates(std::vector<uint64_t>{1, 2}, std::vector<float>{1, 2, 3}, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "4 expected"));
  EXPECT_THAT(SumDuplicates(std::vector<uint64_t>{1}, std::vector<float>{1}, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "dim must be >= 1"));
}

}  // namespace
}  // namespace tessera

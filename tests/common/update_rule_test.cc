#include "common/model/update_rule.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// ASYNC and SSP lower SGD's momentum by what M workers applying on arrival add: 1 - M * (1 - m), at least 0;
// SYNC, AS_GIVEN and Adam keep the job's.
TEST(UpdateRuleTest, AppliedMomentumIsCorrectedForAsynchrony) {
  tessera::v1::JobSpec job;
  job.mutable_optimizer()->set_momentum(0.9f);
  job.mutable_cluster()->set_num_workers(4);
  job.mutable_consistency()->set_async_momentum(tessera::v1::ConsistencySpec::CORRECTED);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::ASYNC);
  EXPECT_NEAR(AppliedOptimizer(job).momentum(), 0.6f, 1e-6);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::SSP);
  EXPECT_NEAR(AppliedOptimizer(job).momentum(), 0.6f, 1e-6);
  job.mutable_cluster()->set_num_workers(16);
  EXPECT_EQ(AppliedOptimizer(job).momentum(), 0.0f) << "never below 0";
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::SYNC);
  EXPECT_FLOAT_EQ(AppliedOptimizer(job).momentum(), 0.9f);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::ASYNC);
  job.mutable_consistency()->set_async_momentum(tessera::v1::ConsistencySpec::AS_GIVEN);
  EXPECT_FLOAT_EQ(AppliedOptimizer(job).momentum(), 0.9f);
}

// SCRIPT: in SYNC a round's values become its mean gradient; in ASYNC and SSP a push (a worker optimizer's
// change) is added, times the staleness-aware scale. Neither keeps optimizer state.
TEST(UpdateRuleTest, TheScriptsOptimizerLeavesTheServersTheMeanOrTheSum) {
  tessera::v1::JobSpec job;
  job.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SCRIPT);
  job.mutable_optimizer()->set_learning_rate(1.0f);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::SYNC);
  const UpdateRule mean(AppliedOptimizer(job));
  EXPECT_EQ(mean.state_slots(), 0);
  std::vector<float> values = {5.0f, -5.0f};
  const std::vector<float> sum = {3.0f, 1.0f};
  mean.Apply(absl::MakeSpan(values), sum, {}, 1, 1.0f, 0.5f);
  EXPECT_EQ(values, (std::vector<float>{1.5f, 0.5f}));
  EXPECT_GE(mean.Bound(5.0, 0.0, 3.0, 1, 1.0f, 0.5f), 1.5);
  job.mutable_consistency()->set_mode(tessera::v1::ConsistencySpec::ASYNC);
  job.mutable_cluster()->set_num_workers(4);
  const UpdateRule add(AppliedOptimizer(job));
  EXPECT_EQ(add.state_slots(), 0);
  add.Apply(absl::MakeSpan(values), sum, {}, 7, 0.5f);
  EXPECT_EQ(values, (std::vector<float>{3.0f, 1.0f})) << "1.5 + 0.5 * 3, 0.5 + 0.5 * 1";
  EXPECT_GE(add.Bound(3.0, 0.0, 3.0, 1, 1.0f, 1.0f), 6.0);
}

TEST(UpdateRuleTest, SgdWithMomentumAccumulatesVelocity) {
  tessera::v1::OptimizerSpec spec;
  spec.set_kind(tessera::v1::OptimizerSpec::SGD);
  spec.set_learning_rate(0.5f);
  spec.set_momentum(0.9f);
  UpdateRule rule(spec);
  std::vector<float> w = {1.0f, -2.0f}, state(2 * rule.state_slots(), 0.0f);
  const std::vector<float> g = {0.2f, 0.4f};
  rule.Apply(absl::MakeSpan(w), g, absl::MakeSpan(state), 1, 1.0f);
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.5f * 0.2f);
  rule.Apply(absl::MakeSpan(w), g, absl::MakeSpan(state), 2, 1.0f);
  // v = 0.9 * 0.2 + 0.2 = 0.38
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.5f * 0.2f - 0.5f * 0.38f);
  EXPECT_FLOAT_EQ(w[1], -2.0f - 0.5f * 0.4f - 0.5f * 0.76f);
}

TEST(UpdateRuleTest, LearningRateScaleShrinksTheStep) {
  tessera::v1::OptimizerSpec spec;
  spec.set_learning_rate(1.0f);
  UpdateRule rule(spec);
  std::vector<float> w = {0.0f}, state(1, 0.0f);
  const std::vector<float> g = {1.0f};
  rule.Apply(absl::MakeSpan(w), g, absl::MakeSpan(state), 1, 0.25f);
  EXPECT_FLOAT_EQ(w[0], -0.25f);
}

TEST(UpdateRuleTest, AdamMatchesTheBiasCorrectedFormula) {
  tessera::v1::OptimizerSpec spec;
  spec.set_kind(tessera::v1::OptimizerSpec::ADAM);
  spec.set_learning_rate(0.01f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  UpdateRule rule(spec);
  ASSERT_EQ(rule.state_slots(), 2);
  std::vector<float> w = {1.0f}, state(2, 0.0f);
  rule.Apply(absl::MakeSpan(w), std::vector<float>{0.5f}, absl::MakeSpan(state), 1, 1.0f);
  EXPECT_NEAR(w[0], 1.0f - 0.01f, 1e-6);  // first step: m_hat / sqrt(v_hat) = sign(g)
  rule.Apply(absl::MakeSpan(w), std::vector<float>{-1.0f}, absl::MakeSpan(state), 2, 1.0f);
  const double m = 0.9 * 0.05 + 0.1 * -1.0, v = 0.999 * 0.00025 + 0.001 * 1.0;
  const double expected = 0.99 - 0.01 * (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.998001)) + 1e-8);
  EXPECT_NEAR(w[0], expected, 1e-6);
}

// SGD's weight decay joins the gradient (torch.optim.SGD's); a parameter named by no_decay gets none.
TEST(UpdateRuleTest, SgdWeightDecayJoinsTheGradientExceptForNoDecayParameters) {
  tessera::v1::OptimizerSpec spec;
  spec.set_kind(tessera::v1::OptimizerSpec::SGD);
  spec.set_learning_rate(0.5f);
  spec.set_weight_decay(0.1f);
  spec.add_no_decay("bias");
  UpdateRule rule(spec);
  EXPECT_TRUE(rule.Decays("layer0/weight"));
  EXPECT_FALSE(rule.Decays("layer0/bias"));
  std::vector<float> w = {2.0f}, state(rule.state_slots(), 0.0f);
  const std::vector<float> g = {0.2f};
  rule.Apply(absl::MakeSpan(w), g, absl::MakeSpan(state), 1, 1.0f, 1.0f, /*decay=*/true);
  EXPECT_FLOAT_EQ(w[0], 2.0f - 0.5f * (0.2f + 0.1f * 2.0f));
  std::vector<float> b = {2.0f}, bstate(rule.state_slots(), 0.0f);
  rule.Apply(absl::MakeSpan(b), g, absl::MakeSpan(bstate), 1, 1.0f, 1.0f, /*decay=*/false);
  EXPECT_FLOAT_EQ(b[0], 2.0f - 0.5f * 0.2f);
}

// AdamW scales the values by 1 - lr * wd before Adam's step; the step itself does not see the decay.
TEST(UpdateRuleTest, AdamwDecaysTheValuesApartFromTheGradient) {
  tessera::v1::OptimizerSpec spec;
  spec.set_kind(tessera::v1::OptimizerSpec::ADAMW);
  spec.set_learning_rate(0.1f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  spec.set_weight_decay(0.5f);
  UpdateRule rule(spec);
  EXPECT_EQ(rule.state_slots(), 2);
  std::vector<float> w = {4.0f}, state(2, 0.0f);
  const std::vector<float> g = {1.0f};
  rule.Apply(absl::MakeSpan(w), g, absl::MakeSpan(state), 1, 1.0f);
  // The first bias-corrected Adam step is lr * g / |g| = 0.1.
  EXPECT_NEAR(w[0], 4.0f * (1.0f - 0.1f * 0.5f) - 0.1f, 1e-5);
}

// A gradient in pieces (a push read where gRPC received it) updates the values and every state slot exactly as
// the same gradient in one array, for every rule; the bounds it returns are the whole pass's.
TEST(UpdateRuleTest, AGradientInPiecesUpdatesExactlyAsInOneArray) {
  const size_t n = 1000;
  std::vector<float> grad(n), start(n);
  for (size_t i = 0; i < n; ++i) {
    grad[i] = std::sin(static_cast<float>(i)) * 0.25f;
    start[i] = std::cos(static_cast<float>(i) * 0.3f);
  }
  FloatPieces pieces;
  const std::vector<size_t> ends = {1, 17, 18, 500, 999, 1000};  // pieces of 1, 16, 1, 482, 499 and 1 values
  for (size_t i = 0; i < ends.size(); ++i) {
    const size_t begin = i == 0 ? 0 : ends[i - 1];
    pieces.Append(absl::MakeConstSpan(grad).subspan(begin, ends[i] - begin));
  }
  ASSERT_EQ(pieces.size(), n);
  ASSERT_EQ(pieces.pieces().size(), 6u);
  using Kind = tessera::v1::OptimizerSpec;
  for (auto kind : {Kind::SGD, Kind::ADAM, Kind::ADAMW, Kind::ROUND_MEAN, Kind::SCRIPT}) {
    tessera::v1::OptimizerSpec spec;
    spec.set_kind(kind);
    spec.set_learning_rate(0.05f);
    spec.set_momentum(0.9f);
    spec.set_beta1(0.9f);
    spec.set_beta2(0.999f);
    spec.set_epsilon(1e-8f);
    spec.set_weight_decay(0.01f);
    const UpdateRule rule(spec);
    std::vector<float> whole = start, pieced = start;
    std::vector<float> whole_state(n * rule.state_slots(), 0.1f), pieced_state = whole_state;
    for (int step = 1; step <= 3; ++step) {
      const UpdateRule::Written a =
          rule.Apply(absl::MakeSpan(whole), grad, absl::MakeSpan(whole_state), step, 0.5f, 0.75f);
      const UpdateRule::Written b =
          rule.ApplyPieces(absl::MakeSpan(pieced), pieces, absl::MakeSpan(pieced_state), step, 0.5f, 0.75f);
      EXPECT_EQ(a.values, b.values) << spec.ShortDebugString();
      EXPECT_EQ(a.state, b.state) << spec.ShortDebugString();
    }
    EXPECT_EQ(whole, pieced) << spec.ShortDebugString();
    EXPECT_EQ(whole_state, pieced_state) << spec.ShortDebugString();
  }
}

// The schedule: a linear warmup to the full rate, then each decay reaches its floor at total_steps and stays.
TEST(UpdateRuleTest, ScheduleFactorsWarmUpThenDecay) {
  tessera::v1::OptimizerSpec spec;
  spec.set_learning_rate(1.0f);
  auto* s = spec.mutable_schedule();
  s->set_warmup_steps(4);
  s->set_total_steps(14);
  s->set_min_factor(0.2f);
  s->set_kind(tessera::v1::ScheduleSpec::COSINE);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(0), 0.25f);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(3), 1.0f);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(4), 1.0f);
  EXPECT_NEAR(UpdateRule(spec).RateFactor(9), 0.2f + 0.8f * 0.5f, 1e-6);  // half way: cos = 0
  EXPECT_NEAR(UpdateRule(spec).RateFactor(14), 0.2f, 1e-6);
  EXPECT_NEAR(UpdateRule(spec).RateFactor(1000), 0.2f, 1e-6);
  s->set_kind(tessera::v1::ScheduleSpec::LINEAR);
  EXPECT_NEAR(UpdateRule(spec).RateFactor(9), 1.0f - 0.8f * 0.5f, 1e-6);
  s->set_kind(tessera::v1::ScheduleSpec::STEP);
  s->set_step_every(3);
  s->set_gamma(0.5f);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(6), 1.0f);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(7), 0.5f);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(10), 0.25f);
  s->set_kind(tessera::v1::ScheduleSpec::CONSTANT);
  EXPECT_FLOAT_EQ(UpdateRule(spec).RateFactor(1000), 1.0f);
}

// The linear scaling rule: the rate was tuned for a reference global batch and grows with the real one.
TEST(UpdateRuleTest, LinearScalingMultipliesTheRateByTheGlobalBatchOverTheReference) {
  tessera::v1::JobSpec job;
  job.set_batch_size(64);
  job.mutable_cluster()->set_num_workers(4);
  job.mutable_optimizer()->set_learning_rate(0.1f);
  job.mutable_optimizer()->mutable_schedule()->set_scaling_reference_batch(128);
  EXPECT_FLOAT_EQ(AppliedOptimizer(job).learning_rate(), 0.1f * 256 / 128);
}

}  // namespace
}  // namespace tessera

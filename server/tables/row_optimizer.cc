#include "server/tables/row_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
absl::Status NonNegative(float value, const char* field) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("row optimizer: ", field, " must be finite and >= 0, got ", value));
}
}  // namespace

absl::Status RowOptimizer::Validate(const RowOptimizerSpec& spec) {
  for (auto [value, field] : {std::pair{spec.learning_rate, "learning_rate"}, {spec.epsilon, "epsilon"},
                              {spec.initial_accumulator, "initial_accumulator"}, {spec.ftrl_beta, "ftrl_beta"},
                              {spec.l1, "l1"}, {spec.l2, "l2"}}) {
    if (absl::Status s = NonNegative(value, field); !s.ok()) return s;
  }
  for (auto [value, field] : {std::pair{spec.beta1, "beta1"}, {spec.beta2, "beta2"}}) {
    if (!(value >= 0 && value < 1)) {
      return absl::InvalidArgumentError(absl::StrCat("row optimizer: ", field, " must be within [0, 1), got ", value));
    }
  }
  if (spec.kind == RowOptimizerSpec::Kind::kFtrl && !(spec.learning_rate > 0)) {
    return absl::InvalidArgumentError("row optimizer: FTRL's learning_rate (alpha) must be > 0");
  }
  return absl::OkStatus();
}

int64_t RowOptimizer::StateFloats(int64_t dim) const {
  switch (spec_.kind) {
    case RowOptimizerSpec::Kind::kSgd:
      return 0;
    case RowOptimizerSpec::Kind::kAdagrad:
      return dim;
    case RowOptimizerSpec::Kind::kRowwiseAdagrad:
      return 1;
    case RowOptimizerSpec::Kind::kFtrl:
    case RowOptimizerSpec::Kind::kLazyAdam:
      return 2 * dim;
  }
  return 0;
}

void RowOptimizer::InitState(absl::Span<float> state) const {
  const bool adagrad =
      spec_.kind == RowOptimizerSpec::Kind::kAdagrad || spec_.kind == RowOptimizerSpec::Kind::kRowwiseAdagrad;
  std::fill(state.begin(), state.end(), adagrad ? spec_.initial_accumulator : 0.0f);
}

void RowOptimizer::Apply(absl::Span<float> w, absl::Span<float> state, absl::Span<const float> g,
                         int64_t step, float lr_scale) const {
  const size_t dim = w.size();
  const float lr = spec_.learning_rate * lr_scale;
  switch (spec_.kind) {
    case RowOptimizerSpec::Kind::kSgd:
      for (size_t i = 0; i < dim; ++i) w[i] -= lr * g[i];
      return;
    case RowOptimizerSpec::Kind::kAdagrad:
      for (size_t i = 0; i < dim; ++i) {
        state[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (std::sqrt(state[i]) + spec_.epsilon);
      }
      return;
    case RowOptimizerSpec::Kind::kRowwiseAdagrad: {
      double squares = 0;
      for (size_t i = 0; i < dim; ++i) squares += double{g[i]} * g[i];
      state[0] += static_cast<float>(squares / static_cast<double>(std::max<size_t>(dim, 1)));
      const float denominator = std::sqrt(state[0]) + spec_.epsilon;
      for (size_t i = 0; i < dim; ++i) w[i] -= lr * g[i] / denominator;
      return;
    }
    case RowOptimizerSpec::Kind::kFtrl: {
      if (!(lr > 0)) return;  // a schedule's rate of 0: FTRL's alpha divides
      float* z = state.data();
      float* n = state.data() + dim;
      for (size_t i = 0; i < dim; ++i) {
        const float n_after = n[i] + g[i] * g[i];
        const float sigma = (std::sqrt(n_after) - std::sqrt(n[i])) / lr;
        z[i] += g[i] - sigma * w[i];
        n[i] = n_after;
        w[i] = std::abs(z[i]) <= spec_.l1 ? 0.0f
                                          : -(z[i] - std::copysign(spec_.l1, z[i])) /
                                                ((spec_.ftrl_beta + std::sqrt(n[i])) / lr + spec_.l2);
      }
      return;
    }
    case RowOptimizerSpec::Kind::kLazyAdam: {
      float* m = state.data();
      float* v = state.data() + dim;
      const double t = static_cast<double>(std::max<int64_t>(step, 1));
      const float m_correction = static_cast<float>(1.0 - std::pow(double{spec_.beta1}, t));
      const float v_correction = static_cast<float>(1.0 - std::pow(double{spec_.beta2}, t));
      for (size_t i = 0; i < dim; ++i) {
        m[i] = spec_.beta1 * m[i] + (1 - spec_.beta1) * g[i];
        v[i] = spec_.beta2 * v[i] + (1 - spec_.beta2) * g[i] * g[i];
        w[i] -= lr * (m[i] / m_correction) / (std::sqrt(v[i] / v_correction) + spec_.epsilon);
      }
      return;
    }
  }
}

}  // namespace tessera

#include "common/model/update_rule.h"

#include <algorithm>
#include <cmath>

#include "common/base/cpu_clones.h"
#include "common/base/tensor_codec.h"
#include "glog/logging.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace tessera {
namespace {

// Flushes subnormal floats to zero while in scope. Momentum and Adam state decays towards zero and, once
// subnormal, makes every update of those elements many times slower (measured: a 2-worker async run spent 38%
// of all CPU time in Apply until this was added). Values below 1.2e-38 carry nothing for training.
class FlushDenormalsScope {
 public:
#if defined(__SSE__)
  FlushDenormalsScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushDenormalsScope() { _mm_setcsr(saved_); }

 private:
  const unsigned int saved_;
#endif
};

}  // namespace

tessera::v1::OptimizerSpec AppliedOptimizer(const tessera::v1::JobSpec& job) {
  tessera::v1::OptimizerSpec spec = job.optimizer();
  if (const int reference = spec.schedule().scaling_reference_batch(); reference > 0) {
    const double global = static_cast<double>(job.batch_size()) * std::max(1, job.cluster().num_workers());
    spec.set_learning_rate(static_cast<float>(spec.learning_rate() * global / reference));
    spec.mutable_schedule()->set_scaling_reference_batch(0);
  }
  const auto& consistency = job.consistency();
  if (spec.kind() == tessera::v1::OptimizerSpec::SCRIPT) {
    if (consistency.mode() == tessera::v1::ConsistencySpec::SYNC) spec.set_kind(tessera::v1::OptimizerSpec::ROUND_MEAN);
    return spec;
  }
  if (consistency.mode() == tessera::v1::ConsistencySpec::SYNC ||
      consistency.async_momentum() == tessera::v1::ConsistencySpec::AS_GIVEN) {
    return spec;
  }
  // M workers applying on arrival add about 1 - 1/M of momentum (each update lands on values about M-1 updates
  // old); explicit momentum m' with (1 - m') / M = 1 - m keeps the total at the job's m.
  const double workers = std::max(1, job.cluster().num_workers());
  auto corrected = [&](double m) { return static_cast<float>(std::max(0.0, 1.0 - workers * (1.0 - m))); };
  if (spec.kind() != tessera::v1::OptimizerSpec::ADAM && spec.kind() != tessera::v1::OptimizerSpec::ADAMW) {
    spec.set_momentum(corrected(spec.momentum()));
  }
  return spec;
}

float UpdateRule::RateFactor(int64_t clock) const {
  const tessera::v1::ScheduleSpec& s = spec_.schedule();
  clock = std::max<int64_t>(0, clock);
  if (clock < s.warmup_steps()) return static_cast<float>(clock + 1) / static_cast<float>(s.warmup_steps());
  const double t = static_cast<double>(clock - s.warmup_steps());
  const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps() - s.warmup_steps()));
  const double done = std::min(1.0, t / span);
  const double floor = s.min_factor();
  switch (s.kind()) {
    case tessera::v1::ScheduleSpec::COSINE:
      return static_cast<float>(floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * done)));
    case tessera::v1::ScheduleSpec::LINEAR:
      return static_cast<float>(1.0 - (1.0 - floor) * done);
    case tessera::v1::ScheduleSpec::STEP:
      return static_cast<float>(std::pow(static_cast<double>(s.gamma()),
                                         static_cast<double>((clock - s.warmup_steps()) / s.step_every())));
    default:
      return 1.0f;
  }
}

bool UpdateRule::Decays(std::string_view parameter) const {
  if (spec_.weight_decay() == 0) return false;
  for (const std::string& pattern : spec_.no_decay()) {
    if (parameter.find(pattern) != std::string_view::npos) return false;
  }
  return true;
}

double UpdateRule::Bound(double params, double state, double grad, int64_t step, float lr_scale,
                         float grad_scale, bool decay) const {
  const double lr = static_cast<double>(spec_.learning_rate()) * lr_scale;
  if (spec_.kind() == tessera::v1::OptimizerSpec::ROUND_MEAN) return grad * std::fabs(static_cast<double>(grad_scale));
  if (spec_.kind() == tessera::v1::OptimizerSpec::SCRIPT) {
    return params + std::fabs(lr) * grad * std::fabs(static_cast<double>(grad_scale));
  }
  const double wd = decay ? static_cast<double>(spec_.weight_decay()) : 0.0;
  const bool coupled = spec_.kind() != tessera::v1::OptimizerSpec::ADAMW;
  // Coupled decay adds wd * |w| to the gradient; decoupled decay scales the values by |1 - lr * wd| first.
  const double g = grad * std::fabs(static_cast<double>(grad_scale)) + (coupled ? wd * params : 0.0);
  if (!coupled) params *= std::max(1.0, std::fabs(1.0 - lr * wd));
  if (adam()) {
    const double b1 = spec_.beta1(), b2 = spec_.beta2();
    const double c1 = 1.0 - std::pow(b1, static_cast<double>(step));
    const double m = b1 * state + (1.0 - b1) * g;
    const double v = b2 * state + (1.0 - b2) * g * g;
    // |m / c1| / (sqrt(v / c2) + eps) <= |m / c1| / eps.
    const double step_size = lr * (m / std::max(c1, 1e-30)) / spec_.epsilon();
    return std::max({params + step_size, m, v});
  }
  const double velocity = spec_.momentum() * state + g;
  return std::max(params + lr * velocity, velocity);
}

namespace {

// The update rules' loops: one pass each, the largest |x| written taken on the way (as bits, see AbsBits).
// Free functions, so that each is compiled for AVX2 and the baseline (TESSERA_CPU_CLONES).
using Written = UpdateRule::Written;

TESSERA_CPU_CLONES Written ReplaceLoop(float* __restrict p, const float* __restrict g, size_t n, float scale) {
  int32_t pmax = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = g[i] * scale;
    pmax = std::max(pmax, AbsBits(p[i]));
  }
  return {FromAbsBits(pmax), 0.0f};
}

TESSERA_CPU_CLONES Written AddLoop(float* __restrict p, const float* __restrict g, size_t n, float rate) {
  int32_t pmax = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] += rate * g[i];
    pmax = std::max(pmax, AbsBits(p[i]));
  }
  return {FromAbsBits(pmax), 0.0f};
}

// SGD with momentum (0 included): v = mu * v + g * grad_scale + coupled * p; p -= lr * v.
TESSERA_CPU_CLONES Written MomentumLoop(float* __restrict p, const float* __restrict g, float* __restrict velocity,
                                        size_t n, float lr, float mu, float grad_scale, float coupled) {
  int32_t pmax = 0, smax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float vi = mu * velocity[i] + g[i] * grad_scale + coupled * p[i];
    velocity[i] = vi;
    p[i] -= lr * vi;
    pmax = std::max(pmax, AbsBits(p[i]));
    smax = std::max(smax, AbsBits(vi));
  }
  return {FromAbsBits(pmax), FromAbsBits(smax)};
}

struct AdamStep {
  float b1, b2, eps;
  float step_size;  // lr / c1
  float sqrt_c2;    // sqrt(c2)
  float grad_scale;
  float coupled;  // L2 decay joined to the gradient (Adam), or 0
  float keep;     // 1 - lr * wd (AdamW's decoupled decay), or 1
};

// torch.optim.Adam's arithmetic: p -= (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps).
TESSERA_CPU_CLONES Written AdamLoop(float* __restrict p, const float* __restrict g, float* __restrict m,
                                    float* __restrict v, size_t n, const AdamStep s) {
  const float one_minus_b1 = 1.0f - s.b1, one_minus_b2 = 1.0f - s.b2;
  int32_t pmax = 0, smax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale + s.coupled * p[i];
    const float mi = s.b1 * m[i] + one_minus_b1 * gi;
    const float vi = s.b2 * v[i] + one_minus_b2 * gi * gi;
    const float pi = p[i] * s.keep - s.step_size * (mi / (std::sqrt(vi) / s.sqrt_c2 + s.eps));
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    pmax = std::max(pmax, AbsBits(pi));
    smax = std::max(smax, std::max(AbsBits(mi), AbsBits(vi)));
  }
  return {FromAbsBits(pmax), FromAbsBits(smax)};
}

}  // namespace

UpdateRule::Written UpdateRule::Apply(absl::Span<float> params, absl::Span<const float> grad,
                                      absl::Span<float> state, int64_t step, float lr_scale, float grad_scale,
                                      bool decay) const {
  CHECK_EQ(params.size(), grad.size());
  return ApplyAt(params, state, grad.data(), 0, grad.size(), step, lr_scale, grad_scale, decay);
}

UpdateRule::Written UpdateRule::ApplyPieces(absl::Span<float> params, const FloatPieces& grad,
                                            absl::Span<float> state, int64_t step, float lr_scale, float grad_scale,
                                            bool decay) const {
  CHECK_EQ(params.size(), grad.size());
  Written all;
  grad.ForEach([&](size_t offset, absl::Span<const float> piece) {
    const Written w = ApplyAt(params, state, piece.data(), offset, piece.size(), step, lr_scale, grad_scale, decay);
    all.values = std::max(all.values, w.values);  // infinity wins, as in one pass
    all.state = std::max(all.state, w.state);
  });
  return all;
}

UpdateRule::Written UpdateRule::ApplyAt(absl::Span<float> all_params, absl::Span<float> all_state, const float* grad,
                                        size_t offset, size_t n, int64_t step, float lr_scale, float grad_scale,
                                        bool decay) const {
  CHECK_EQ(all_state.size(), all_params.size() * static_cast<size_t>(state_slots()));
  CHECK_LE(offset + n, all_params.size());
  FlushDenormalsScope flush;
  // The values [offset, offset + n), and the same range of each state slot (slot k at k * all_params.size()).
  float* const params = all_params.data() + offset;
  float* const state = all_state.empty() ? nullptr : all_state.data() + offset;
  const size_t slot = all_params.size();
  const float lr = spec_.learning_rate() * lr_scale;
  if (spec_.kind() == tessera::v1::OptimizerSpec::ROUND_MEAN) return ReplaceLoop(params, grad, n, grad_scale);
  if (spec_.kind() == tessera::v1::OptimizerSpec::SCRIPT) return AddLoop(params, grad, n, lr * grad_scale);
  const float wd = decay ? spec_.weight_decay() : 0.0f;
  // L2 (SGD, Adam: the decay joins the gradient, as torch.optim's weight_decay) or decoupled (AdamW: the values
  // shrink by 1 - lr * wd before the step, which does not see the decay).
  const bool decoupled = spec_.kind() == tessera::v1::OptimizerSpec::ADAMW;
  const float coupled = decoupled ? 0.0f : wd;
  if (adam()) {
    // The bias corrections of this step, once per call.
    const float b1 = spec_.beta1(), b2 = spec_.beta2();
    const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), static_cast<double>(step)));
    const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), static_cast<double>(step)));
    const AdamStep s{b1, b2, spec_.epsilon(), lr / c1, std::sqrt(c2), grad_scale, coupled,
                     decoupled ? 1.0f - lr * wd : 1.0f};
    return AdamLoop(params, grad, state, state + slot, n, s);
  }
  return MomentumLoop(params, grad, state, n, lr, spec_.momentum(), grad_scale, coupled);
}

}  // namespace tessera

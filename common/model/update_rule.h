// Update rules a server applies to the chunks it owns and a local-mode worker to whole tensors. In common/ so
// that both roles use the one implementation without the worker linking the server library.
//
// Every rule is elementwise, so applying it chunk by chunk gives exactly what applying it to the whole tensor
// gives; that is what lets a sharded run match a single process.
#ifndef TESSERA_COMMON_MODEL_UPDATE_RULE_H_
#define TESSERA_COMMON_MODEL_UPDATE_RULE_H_

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "common/base/float_pieces.h"
#include "proto/job.pb.h"

namespace tessera {

// The optimizer a server applies for `job` (validated, defaults applied): the job's, with the momentum
// corrected for the implicit momentum of asynchrony in ASYNC and SSP (ConsistencySpec.async_momentum) and the
// learning rate scaled by the linear scaling rule when the schedule asks for it.
tessera::v1::OptimizerSpec AppliedOptimizer(const tessera::v1::JobSpec& job);

// One optimizer, configured once. Thread-compatible (const methods only; state lives with the caller).
class UpdateRule {
 public:
  // `spec` must have passed ValidateJobSpec.
  explicit UpdateRule(const tessera::v1::OptimizerSpec& spec) : spec_(spec) {}

  // Floats of optimizer state per parameter element: 1 for SGD (momentum buffer), 2 for Adam and AdamW (m, v),
  // none where the workers' own optimizer runs (SCRIPT, ROUND_MEAN).
  int state_slots() const { return combines_only() ? 0 : adam() ? 2 : 1; }

  // The schedule's factor of the learning rate for an update of step `clock` (0: the first step).
  float RateFactor(int64_t clock) const;
  // Whether the parameter named `parameter` gets weight decay (its name holds none of optimizer.no_decay).
  bool Decays(std::string_view parameter) const;

  // One step on `params` with gradient `grad`. `state` holds state_slots() * params.size() floats, zero before
  // the first step. `step` counts the updates applied to these values, this one included (Adam's bias
  // correction). The learning rate is multiplied by `lr_scale` (the schedule's factor, times the staleness-aware
  // scale); the gradient is read as grad[i] * grad_scale (a sync round's sum of weighted gradients becomes their
  // mean without another pass). `decay`: apply the optimizer's weight decay (see Decays). SCRIPT adds
  // lr_scale * grad * grad_scale to the values (an update a worker's optimizer made); ROUND_MEAN replaces the
  // values by grad * grad_scale (the round's mean gradient).
  //
  // One pass over the arrays (vectorised, bias corrections once per call). Returns the largest |value| and
  // |state| it wrote, taken in the same pass, infinity when anything came out non-finite: the server's bounds for
  // its next update (see Bound) without reading the chunk again.
  struct Written {
    float values = 0;  // max |params| after the update
    float state = 0;   // max |state| after the update
  };
  Written Apply(absl::Span<float> params, absl::Span<const float> grad, absl::Span<float> state, int64_t step,
                float lr_scale, float grad_scale = 1.0f, bool decay = true) const;
  // The same with the gradient in pieces (a push read where it was received): each piece updates the values and
  // state at its offset, with the same arithmetic as one call over the whole.
  Written ApplyPieces(absl::Span<float> params, const FloatPieces& grad, absl::Span<float> state, int64_t step,
                      float lr_scale, float grad_scale = 1.0f, bool decay = true) const;

  // An upper bound on every |value| and |state| after Apply, given bounds before it on |params|, |state| and
  // |grad| (before grad_scale). The server applies in place when this is far below the largest float, and
  // keeps a copy to undo the update otherwise.
  double Bound(double params, double state, double grad, int64_t step, float lr_scale, float grad_scale,
               bool decay = true) const;

 private:
  // Apply over values [offset, offset + n) of `params` (and of each state slot) with the n values at `grad`.
  Written ApplyAt(absl::Span<float> params, absl::Span<float> state, const float* grad, size_t offset, size_t n,
                  int64_t step, float lr_scale, float grad_scale, bool decay) const;
  bool combines_only() const {
    return spec_.kind() == tessera::v1::OptimizerSpec::SCRIPT || spec_.kind() == tessera::v1::OptimizerSpec::ROUND_MEAN;
  }
  bool adam() const {
    return spec_.kind() == tessera::v1::OptimizerSpec::ADAM || spec_.kind() == tessera::v1::OptimizerSpec::ADAMW;
  }

  const tessera::v1::OptimizerSpec spec_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_UPDATE_RULE_H_

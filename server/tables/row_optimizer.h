// The optimizers of an embedding table's rows (ParameterSpec.embedding's optimizer; tables/sparse_table.h applies
// them).
// A row is `dim` float values keyed by a 64-bit id; its optimizer keeps StateFloats(dim) floats beside it, zero
// before its first update, and the table counts each row's own updates (`step`, for lazy Adam's bias correction:
// a row untouched by a step is not decayed by it, which is what "lazy" means).
//
//   SGD               w -= lr * g
//   AdaGrad           a += g^2;                  w -= lr * g / (sqrt(a) + eps)          (per coordinate: dim floats)
//   row-wise AdaGrad  a += mean(g^2) over the row; w -= lr * g / (sqrt(a) + eps)        (one float per row)
//   FTRL-Proximal     per coordinate, McMahan et al. (KDD 2013), with alpha = lr:         (z and n: 2 * dim floats)
//                     sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g^2;
//                     w = 0 when |z| <= l1, else -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)
//   lazy Adam         m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;                   (m and v: 2 * dim floats)
//                     w -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
//
// AdaGrad's accumulators start at `initial_accumulator`, FTRL's n at 0.
#ifndef TESSERA_SERVER_TABLES_ROW_OPTIMIZER_H_
#define TESSERA_SERVER_TABLES_ROW_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tessera {

struct RowOptimizerSpec {
  enum class Kind { kSgd, kAdagrad, kRowwiseAdagrad, kFtrl, kLazyAdam };
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;  // FTRL's alpha
  float epsilon = 1e-8f;        // AdaGrad, row-wise AdaGrad, lazy Adam
  float initial_accumulator = 0.0f;  // AdaGrad, row-wise AdaGrad
  float beta1 = 0.9f;           // lazy Adam
  float beta2 = 0.999f;         // lazy Adam
  float ftrl_beta = 1.0f;       // FTRL
  float l1 = 0.0f;              // FTRL
  float l2 = 0.0f;              // FTRL
};

// Thread-compatible: const methods only; a row's values and state are the caller's (under the row's lock).
class RowOptimizer {
 public:
  explicit RowOptimizer(const RowOptimizerSpec& spec) : spec_(spec) {}

  // INVALID_ARGUMENT naming the field for a spec no row can be trained with (a rate, epsilon or l1/l2 that is
  // negative or not finite, betas outside [0, 1)).
  static absl::Status Validate(const RowOptimizerSpec& spec);

  // Floats of state per row of `dim` values.
  int64_t StateFloats(int64_t dim) const;
  // A new row's state (StateFloats(dim) floats): the accumulators' start.
  void InitState(absl::Span<float> state) const;

  // One update of a row: `grad` (the batch's gradient of the row, duplicates summed) applied to `values`, with
  // the row's `state`; `step` counts this row's updates, this one included (1 for its first). `lr_scale` scales
  // the learning rate (a schedule's factor).
  void Apply(absl::Span<float> values, absl::Span<float> state, absl::Span<const float> grad, int64_t step,
             float lr_scale = 1.0f) const;

 private:
  const RowOptimizerSpec spec_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_TABLES_ROW_OPTIMIZER_H_

#include "common/row_batch.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
// Row `a` before row `b` of the same id: lexicographically by the bit patterns of their floats.
bool BitsBefore(const float* a, const float* b, int64_t dim) {
  for (int64_t i = 0; i < dim; ++i) {
    uint32_t x;
    uint32_t y;
    std::memcpy(&x, a + i, sizeof(x));
    std::memcpy(&y, b + i, sizeof(y));
    if (x != y) return x < y;
  }
  return false;
}
}  // namespace

absl::StatusOr<RowGradients> SumDuplicates(absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                           int64_t dim) {
  if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("rows of dim ", dim, ": dim must be >= 1"));
  if (grads.size() != ids.size() * static_cast<size_t>(dim)) {
    return absl::InvalidArgumentError(absl::StrCat(grads.size(), " gradient values for ", ids.size(),
                                                   " ids of dim ", dim, " (", ids.size() * dim, " expected)"));
  }
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (ids[a] != ids[b]) return ids[a] < ids[b];
    return BitsBefore(grads.data() + a * dim, grads.data() + b * dim, dim);
  });
  RowGradients out;
  for (size_t k = 0; k < order.size(); ++k) {
    const float* row = grads.data() + order[k] * dim;
    if (k > 0 && ids[order[k]] == out.ids.back()) {
      float* sum = out.grads.data() + (out.ids.size() - 1) * dim;
      for (int64_t i = 0; i < dim; ++i) sum[i] += row[i];
      ++out.duplicates;
      continue;
    }
    out.ids.push_back(ids[order[k]]);
    out.grads.insert(out.grads.end(), row, row + dim);
  }
  return out;
}

}  // namespace tessera

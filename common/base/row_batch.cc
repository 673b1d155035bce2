#include "common/base/row_batch.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

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

// `pairs` ascending by id: a least-significant-digit radix sort, a byte a pass (a pass whose byte is the same in
// every id is skipped). Linear in the batch, where a comparison sort of 65,536 ids took most of a push's time.
void SortById(std::vector<std::pair<uint64_t, uint32_t>>& pairs) {
  std::vector<std::pair<uint64_t, uint32_t>> scratch(pairs.size());
  for (int shift = 0; shift < 64; shift += 8) {
    size_t counts[257] = {};
    for (const auto& p : pairs) ++counts[((p.first >> shift) & 0xFF) + 1];
    if (counts[((pairs[0].first >> shift) & 0xFF) + 1] == pairs.size()) continue;  // one value of this byte
    for (int b = 0; b < 256; ++b) counts[b + 1] += counts[b];
    for (const auto& p : pairs) scratch[counts[(p.first >> shift) & 0xFF]++] = p;
    pairs.swap(scratch);
  }
}
}  // namespace

absl::StatusOr<RowGradients> SumDuplicates(absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                           int64_t dim) {
  if (dim < 1) return absl::InvalidArgumentError(absl::StrCat("rows of dim ", dim, ": dim must be >= 1"));
  if (grads.size() != ids.size() * static_cast<size_t>(dim)) {
    return absl::InvalidArgumentError(absl::StrCat(grads.size(), " gradient values for ", ids.size(),
                                                   " ids of dim ", dim, " (", ids.size() * dim, " expected)"));
  }
  if (ids.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " rows in one batch; at most 2^32 - 1"));
  }
  // Sorted by id on a contiguous copy of (id, row) pairs; only runs of one id, which are rare, compare rows.
  std::vector<std::pair<uint64_t, uint32_t>> order(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) order[i] = {ids[i], static_cast<uint32_t>(i)};
  if (!order.empty()) SortById(order);
  RowGradients out;
  out.ids.reserve(order.size());
  out.grads.reserve(grads.size());
  for (size_t k = 0; k < order.size();) {
    size_t end = k + 1;
    while (end < order.size() && order[end].first == order[k].first) ++end;
    if (end - k > 1) {
      std::sort(order.begin() + k, order.begin() + end, [&](const auto& a, const auto& b) {
        return BitsBefore(grads.data() + a.second * dim, grads.data() + b.second * dim, dim);
      });
    }
    out.ids.push_back(order[k].first);
    const float* first = grads.data() + static_cast<size_t>(order[k].second) * dim;
    out.grads.insert(out.grads.end(), first, first + dim);
    float* sum = out.grads.data() + (out.ids.size() - 1) * dim;
    for (size_t j = k + 1; j < end; ++j) {
      const float* row = grads.data() + static_cast<size_t>(order[j].second) * dim;
      for (int64_t i = 0; i < dim; ++i) sum[i] += row[i];
      ++out.duplicates;
    }
    k = end;
  }
  return out;
}

absl::StatusOr<RowGradients> SumDuplicates(RowGradients batch, int64_t dim) {
  const bool ascending =
      std::adjacent_find(batch.ids.begin(), batch.ids.end(), [](uint64_t a, uint64_t b) { return a >= b; }) ==
      batch.ids.end();
  if (!ascending || dim < 1 || batch.grads.size() != batch.ids.size() * static_cast<size_t>(dim)) {
    return SumDuplicates(batch.ids, batch.grads, dim);  // sums, or says what is wrong
  }
  batch.duplicates = 0;
  return batch;
}

}  // namespace tessera

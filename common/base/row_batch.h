// A batch of embedding-table row gradients with every id once, as a worker sends it and a server applies it
// (both sum a batch's duplicates here). The rows of one id are summed in an order fixed by their values
// (ascending by their float bit patterns), not by their place in the batch, so a batch in any order gives bit for
// bit the same sums. Linear in the batch (a radix sort of the ids).
#ifndef TESSERA_COMMON_BASE_ROW_BATCH_H_
#define TESSERA_COMMON_BASE_ROW_BATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {

struct RowGradients {
  std::vector<uint64_t> ids;  // ascending, each once
  std::vector<float> grads;   // ids.size() rows of `dim`
  int64_t duplicates = 0;     // rows folded into another of the same id
};

// Sums the rows of `grads` (ids.size() rows of `dim` floats) that share an id. INVALID_ARGUMENT, computing
// nothing, for dim < 1 or a gradient of another length.
absl::StatusOr<RowGradients> SumDuplicates(absl::Span<const uint64_t> ids, absl::Span<const float> grads, int64_t dim);
// The same for a batch it may take over: one whose ids are already strictly ascending (what a worker sends) is
// returned as it is, without a sort or a copy.
absl::StatusOr<RowGradients> SumDuplicates(RowGradients batch, int64_t dim);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_ROW_BATCH_H_

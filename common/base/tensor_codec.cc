#include "common/base/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/cpu_clones.h"

namespace tessera {

static_assert(sizeof(float) == 4, "float32 is assumed");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "The wire format is little-endian; a big-endian host needs byte swapping here."
#endif

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(absl::Span<const int64_t> shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

void EncodeFloats(absl::Span<const float> values, std::string* out) {
  const size_t old = out->size();
  out->resize(old + values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(out->data() + old, values.data(), values.size() * sizeof(float));
}

bool AllFinite(absl::Span<const float> values) { return std::isfinite(MaxAbs(values)); }

namespace {

// The largest AbsBits of p[0..n), in sixteen independent lanes, so that the loop is not one chain of dependent
// maxima.
TESSERA_CPU_CLONES int32_t LargestAbsBits(const float* p, size_t n) {
  constexpr size_t kLanes = 16;
  int32_t lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const int32_t bits = AbsBits(p[i + k]);
      lanes[k] = lanes[k] > bits ? lanes[k] : bits;
    }
  }
  int32_t largest = 0;
  for (; i < n; ++i) largest = std::max(largest, AbsBits(p[i]));
  for (int32_t lane : lanes) largest = std::max(largest, lane);
  return largest;
}

}  // namespace

float MaxAbs(absl::Span<const float> values) { return FromAbsBits(LargestAbsBits(values.data(), values.size())); }

absl::Status CheckFinite(absl::Span<const float> values, std::string_view what, size_t first_index) {
  if (AllFinite(values)) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": value at index ", first_index + i, " is ", values[i],
                                                     "; gradients must be finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera

#include "common/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

float MaxAbs(absl::Span<const float> values) {
  // |x| as bits orders like |x| for finite floats, and every NaN and infinity is above them all; an unsigned
  // integer max vectorises where a float max would not.
  const float* p = values.data();
  const size_t n = values.size();
  uint32_t largest = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    largest = std::max(largest, bits & 0x7fffffffu);
  }
  if (largest >= 0x7f800000u) return std::numeric_limits<float>::infinity();
  float out;
  std::memcpy(&out, &largest, sizeof(out));
  return out;
}

absl::Status CheckFinite(absl::Span<const float> values, std::string_view what) {
  if (AllFinite(values)) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": value at index ", i, " is ", values[i],
                                                     "; gradients must be finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera

// Dense float32 values on the wire: raw little-endian bytes, never `repeated float`.
#ifndef TESSERA_COMMON_BASE_TENSOR_CODEC_H_
#define TESSERA_COMMON_BASE_TENSOR_CODEC_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tessera {

// Number of elements of a shape; 0 for an empty shape list means a scalar of 1 element.
int64_t NumElements(absl::Span<const int64_t> shape);

// "[784, 256]".
std::string ShapeString(absl::Span<const int64_t> shape);

// Appends the little-endian bytes of `values` to `out`.
void EncodeFloats(absl::Span<const float> values, std::string* out);

// True when no value is NaN or infinite (one vectorised pass: MaxAbs).
bool AllFinite(absl::Span<const float> values);

// |x| as the bits of a float, sign cleared: for finite floats they order as |x| does, and every NaN and infinity
// lies above them all, so an integer max (which vectorises where a float max does not; a signed one serves)
// finds the largest |x| and any non-finite value at once. FromAbsBits turns the largest back into a float:
// infinity for a NaN or an infinity.
inline int32_t AbsBits(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7fffffff;
}
inline float FromAbsBits(int32_t bits) {
  if (bits >= 0x7f800000) return std::numeric_limits<float>::infinity();
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// The largest |value| (0 for none); infinity when any value is NaN or infinite. One vectorised pass.
float MaxAbs(absl::Span<const float> values);

// INVALID_ARGUMENT naming `what` and the first offending index when any value is NaN or infinite.
// `first_index`: the index of values[0] in what the message names (a part of a larger array).
[[nodiscard]] absl::Status CheckFinite(absl::Span<const float> values, std::string_view what, size_t first_index = 0);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_TENSOR_CODEC_H_

// Dense float32 values on the wire: raw little-endian bytes, never `repeated float`.
#ifndef TESSERA_COMMON_TENSOR_CODEC_H_
#define TESSERA_COMMON_TENSOR_CODEC_H_

#include <cstdint>
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

// The largest |value| (0 for none); infinity when any value is NaN or infinite. One vectorised pass.
float MaxAbs(absl::Span<const float> values);

// INVALID_ARGUMENT naming `what` and the first offending index when any value is NaN or infinite.
[[nodiscard]] absl::Status CheckFinite(absl::Span<const float> values, std::string_view what);

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_CODEC_H_

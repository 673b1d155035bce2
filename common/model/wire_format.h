// Values on the wire in the precision a job asks for (JobSpec.wire, proto/job.proto): float32, bfloat16 or IEEE
// half, densely or as top-k (index, value) pairs. Rounding is to nearest, ties to even.
//
// A worker encodes a chunk's gradient with error feedback: what rounding (and top-k) left out is kept in the
// chunk's residual and added to its next gradient, so every part of a gradient reaches the server eventually.
//
//   std::vector<float> residual(n);                       // one per chunk, zero to start
//   std::vector<char> wire(MaxEncodedBytes(encoding, n));
//   size_t bytes = EncodeGradient(grad, residual, encoding, wire.data());
//   ...
//   // The receiver copies the bytes to the front of its float buffer and decodes there:
//   TESSERA_RETURN_IF_ERROR(DecodeInPlace(out, bytes, encoding, "push to w/0"));
#ifndef TESSERA_COMMON_MODEL_WIRE_FORMAT_H_
#define TESSERA_COMMON_MODEL_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/job.pb.h"

namespace tessera {

using WirePrecision = tessera::v1::WireSpec::Precision;

// How one message's values are laid out.
struct WireEncoding {
  WirePrecision precision = tessera::v1::WireSpec::FP32;
  // Top-k: k uint32 indices, ascending, then their k values; every other entry is 0. `top_k` (a fraction of the
  // entries, in (0, 0.5]) says how many an encoder keeps; a decoder reads k from the length.
  bool sparse = false;
  float top_k = 0;
};

// "FP32", "BF16", "FP16".
const char* PrecisionName(WirePrecision precision);
size_t BytesPerValue(WirePrecision precision);
// The entries a top-k encoding of `n` values keeps: top_k * n rounded, at least 1 (0 for n == 0).
size_t TopKCount(float top_k, size_t n);
// The most bytes an encoding of `n` values takes; dense encodings take exactly this many.
size_t MaxEncodedBytes(const WireEncoding& encoding, size_t n);

// Values rounded into `precision` (dense), for pulls: writes n * BytesPerValue bytes to `out`.
void EncodeValues(absl::Span<const float> values, WirePrecision precision, char* out);

// A gradient with error feedback: encodes grad + residual and leaves in `residual` what the encoding left out.
// Returns the bytes written to `out` (at most MaxEncodedBytes) and whether they are top-k entries: a chunk whose
// top-k entries would take as many bytes as its dense values (a tiny chunk) goes dense. `grad` and `residual`
// have the same size.
struct EncodedGradient {
  size_t bytes = 0;
  bool sparse = false;
};
EncodedGradient EncodeGradient(absl::Span<const float> grad, absl::Span<float> residual, const WireEncoding& encoding,
                               char* out);

// Decodes `bytes` encoded bytes that lie at the front of `out`'s memory into out.size() float32 values, in
// place. INVALID_ARGUMENT naming `what` for an unknown precision, a length that does not fit the encoding and
// out.size() (top-k entries must take fewer bytes than the dense values), or top-k indices that are out of
// range or not ascending. Values are not checked for finiteness here.
[[nodiscard]] absl::Status DecodeInPlace(absl::Span<float> out, size_t bytes, const WireEncoding& encoding,
                                         std::string_view what);

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_WIRE_FORMAT_H_

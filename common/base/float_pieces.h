// Float32 values that lie in consecutive pieces of memory rather than in one span: a push's gradient read where
// gRPC received it (common/rpc/wire_payload.h), in the fragments of its byte buffer, instead of being copied into one
// array first. Code that walks values once (a sum, an update rule, a norm) takes FloatPieces and runs over each
// piece at its offset; one span converts implicitly, so callers that hold an array pass it as before.
//
//   FloatPieces grad = ...;                      // 3 pieces: [0, 16384), [16384, 16385), [16385, 262144)
//   grad.ForEach([&](size_t offset, absl::Span<const float> piece) {
//     for (size_t i = 0; i < piece.size(); ++i) sum[offset + i] += piece[i];
//   });
#ifndef TESSERA_COMMON_BASE_FLOAT_PIECES_H_
#define TESSERA_COMMON_BASE_FLOAT_PIECES_H_

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace tessera {

// A view: the memory of its pieces must outlive it. Thread-compatible.
class FloatPieces {
 public:
  struct Piece {
    size_t offset;  // of the piece's first value among all the values
    absl::Span<const float> values;
  };

  FloatPieces() = default;
  // One piece (implicit: an array is the common case).
  FloatPieces(absl::Span<const float> values);  // NOLINT(google-explicit-constructor)
  FloatPieces(const std::vector<float>& values)  // NOLINT(google-explicit-constructor)
      : FloatPieces(absl::MakeConstSpan(values)) {}

  // Appends `values` after the values so far (an empty span adds nothing).
  void Append(absl::Span<const float> values);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  absl::Span<const Piece> pieces() const { return pieces_; }
  // Calls f(offset, piece) for each piece, in order.
  template <typename F>
  void ForEach(F&& f) const {
    for (const Piece& p : pieces_) f(p.offset, p.values);
  }
  // Copies every value to out[0, size()).
  void CopyTo(absl::Span<float> out) const;
  // The largest |value| (NaN or infinity when there is one), as tensor_codec's MaxAbs: from the pass that
  // checked the values where it recorded it (set_max_abs), else computed.
  float MaxAbs() const;
  void set_max_abs(float max_abs) { max_abs_ = max_abs; }

 private:
  absl::InlinedVector<Piece, 1> pieces_;
  size_t size_ = 0;
  std::optional<float> max_abs_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_FLOAT_PIECES_H_

#include "common/base/float_pieces.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/tensor_codec.h"

namespace tessera {

FloatPieces::FloatPieces(absl::Span<const float> values) { Append(values); }

void FloatPieces::Append(absl::Span<const float> values) {
  if (values.empty()) return;
  pieces_.push_back(Piece{size_, values});
  size_ += values.size();
  max_abs_.reset();
}

void FloatPieces::CopyTo(absl::Span<float> out) const {
  for (const Piece& p : pieces_) {
    if (out.data() + p.offset != p.values.data()) {
      std::memcpy(out.data() + p.offset, p.values.data(), p.values.size() * sizeof(float));
    }
  }
}

float FloatPieces::MaxAbs() const {
  if (max_abs_) return *max_abs_;
  float largest = 0.0f;
  for (const Piece& p : pieces_) {
    const float m = tessera::MaxAbs(p.values);
    // NaN wins, as in one pass over all the values.
    if (std::isnan(m) || !(m <= largest)) largest = m;
    if (std::isnan(largest)) break;
  }
  return largest;
}

}  // namespace tessera

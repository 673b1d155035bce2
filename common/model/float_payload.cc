#include "common/model/float_payload.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"

namespace tessera {

absl::Status FloatPayload::CopyFloatsTo(absl::Span<float> out, bool check_finite, std::string_view what) const {
  const WireEncoding& e = encoding();
  if (!e.sparse && e.precision == tessera::v1::WireSpec::FP32) {
    TESSERA_RETURN_IF_ERROR(CheckFloat32Length(out.size(), what));
    return CopyFloat32To(out, check_finite, what);
  }
  // Every encoding but top-k is at most as long as the float32 values; top-k longer than that is refused.
  if (size() > out.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", size(), " bytes for ", out.size(),
                                                   " values in ", PrecisionName(e.precision)));
  }
  CopyBytesTo(reinterpret_cast<char*>(out.data()));
  TESSERA_RETURN_IF_ERROR(DecodeInPlace(out, size(), e, what));
  return check_finite ? CheckFinite(out, what) : absl::OkStatus();
}

absl::Status FloatPayload::CheckFloat32Length(size_t n, std::string_view what) const {
  if (size() == n * sizeof(float)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected ", n * sizeof(float), " bytes (", n,
                                                 " float32 values), got ", size()));
}

absl::StatusOr<FloatPieces> FloatPayload::Float32Pieces(size_t, std::string_view, absl::Span<float>) const {
  return absl::UnimplementedError("this payload's values are decoded into memory of their own (CopyFloatsTo)");
}

absl::Status FloatPayload::CopyFloat32To(absl::Span<float> out, bool check_finite, std::string_view what) const {
  CopyBytesTo(reinterpret_cast<char*>(out.data()));
  return check_finite ? CheckFinite(out, what) : absl::OkStatus();
}

void SpanPayload::CopyBytesTo(char* out) const {
  if (!bytes_.empty() && out != bytes_.data()) std::memcpy(out, bytes_.data(), bytes_.size());
}

}  // namespace tessera

#include "common/float_payload.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace tessera {

absl::Status SpanPayload::CopyFloatsTo(absl::Span<float> out, bool check_finite, std::string_view what) const {
  if (values_.size() != out.size()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected ", out.size() * sizeof(float),
                                                   " bytes (", out.size(), " float32 values), got ", size()));
  }
  if (check_finite) TESSERA_RETURN_IF_ERROR(CheckFinite(values_, what));
  std::copy(values_.begin(), values_.end(), out.begin());
  return absl::OkStatus();
}

}  // namespace tessera

// The float32 values of a push, however they arrived, for code that must not depend on the transport.
#ifndef TESSERA_COMMON_FLOAT_PAYLOAD_H_
#define TESSERA_COMMON_FLOAT_PAYLOAD_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tessera {

// Bytes that are copied once into their destination. Thread-compatible.
class FloatPayload {
 public:
  virtual ~FloatPayload() = default;
  // Length in bytes.
  virtual size_t size() const = 0;
  // Copies exactly out.size() float32 values. INVALID_ARGUMENT naming `what` when the byte length differs or
  // (with `check_finite`) a value is NaN or infinite; `out` may then hold part of the values.
  [[nodiscard]] virtual absl::Status CopyFloatsTo(absl::Span<float> out, bool check_finite,
                                                  std::string_view what) const = 0;
};

// Values already in memory (tests, in-process callers). The span must outlive the payload.
class SpanPayload final : public FloatPayload {
 public:
  explicit SpanPayload(absl::Span<const float> values) : values_(values) {}
  size_t size() const override { return values_.size() * sizeof(float); }
  absl::Status CopyFloatsTo(absl::Span<float> out, bool check_finite, std::string_view what) const override;

 private:
  absl::Span<const float> values_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FLOAT_PAYLOAD_H_

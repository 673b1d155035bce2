// The values of a push or a reply, however they arrived and in whatever precision they travelled (see
// common/model/wire_format.h), for code that must not depend on the transport.
#ifndef TESSERA_COMMON_MODEL_FLOAT_PAYLOAD_H_
#define TESSERA_COMMON_MODEL_FLOAT_PAYLOAD_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/float_pieces.h"
#include "common/model/wire_format.h"

namespace tessera {

// Bytes that are decoded once into their destination. Thread-compatible.
class FloatPayload {
 public:
  virtual ~FloatPayload() = default;
  // Length in bytes.
  virtual size_t size() const = 0;
  // How the bytes encode values (float32, dense, unless set).
  const WireEncoding& encoding() const { return encoding_; }
  void set_encoding(const WireEncoding& encoding) { encoding_ = encoding; }
  // Decodes exactly out.size() float32 values into `out`. INVALID_ARGUMENT naming `what` when the byte length
  // does not fit the encoding or (with `check_finite`) a value is NaN or infinite; `out` may then hold part of
  // the values.
  // `out` may be Room()'s memory: the bytes are decoded where they lie.
  [[nodiscard]] absl::Status CopyFloatsTo(absl::Span<float> out, bool check_finite, std::string_view what) const;
  // Writable memory, holding the bytes at its front, with room for `n` float32 values; null when the payload
  // has none. Decoding a push there (CopyFloatsTo) saves copying it into a buffer of its own first.
  virtual float* Room(size_t n) const { return nullptr; }
  // True when the values can be read where they lie (Float32Pieces): dense float32 in memory that holds them
  // apart (a received byte buffer's fragments).
  virtual bool reads_in_place() const { return false; }
  // Where reads_in_place(): exactly n float32 values as pieces of the payload's own memory, checked as
  // CopyFloatsTo(..., check_finite=true, what) checks them, with their largest |value| recorded. A value split
  // between two fragments, and a fragment whose bytes are not aligned for floats, are copied to the same offset
  // of `spill` (at least n floats; the pieces may point into it, so it must outlive them unchanged).
  // UNIMPLEMENTED elsewhere.
  [[nodiscard]] virtual absl::StatusOr<FloatPieces> Float32Pieces(size_t n, std::string_view what,
                                                                  absl::Span<float> spill) const;

 protected:
  // INVALID_ARGUMENT naming `what` unless the payload is exactly n float32 values long.
  [[nodiscard]] absl::Status CheckFloat32Length(size_t n, std::string_view what) const;
  // Copies the size() bytes to `out`.
  virtual void CopyBytesTo(char* out) const = 0;
  // float32, dense: copies exactly out.size() values (the length checked already), checking as CopyFloatsTo.
  [[nodiscard]] virtual absl::Status CopyFloat32To(absl::Span<float> out, bool check_finite,
                                                   std::string_view what) const;

 private:
  WireEncoding encoding_;
};

// Bytes already in memory (a received buffer, tests, in-process callers). The memory must outlive the payload.
class SpanPayload final : public FloatPayload {
 public:
  explicit SpanPayload(std::string_view bytes) : bytes_(bytes) {}
  explicit SpanPayload(absl::Span<const float> values)
      : bytes_(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)) {}
  // `length` bytes at the front of writable memory of `capacity` bytes (float-aligned), which decoding may use.
  SpanPayload(char* memory, size_t length, size_t capacity)
      : bytes_(memory, length), room_(memory), capacity_(capacity) {}
  size_t size() const override { return bytes_.size(); }
  float* Room(size_t n) const override {
    return room_ != nullptr && n * sizeof(float) <= capacity_ ? reinterpret_cast<float*>(room_) : nullptr;
  }

 protected:
  void CopyBytesTo(char* out) const override;

 private:
  std::string_view bytes_;
  char* room_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MODEL_FLOAT_PAYLOAD_H_

// Messages whose one large `bytes` field (a chunk's float32 values) travels beside the message instead of
// inside a protobuf string.
//
// Sending: the message is serialised without that field, followed by the field's tag and length and then the
// payload bytes as a slice of their own (memory the caller owns, or a pooled buffer). In protobuf's wire format
// a concatenation of fields is one message, so any protobuf reader sees the ordinary message of proto/ps.proto,
// while the payload goes from the tensor's memory to the socket without being copied into a string first.
//
// Receiving: the fields other than the payload are parsed into the message; the payload stays in gRPC's slices
// (no copy) until CopyFloatsTo writes it, once, into its destination, decoding it from its wire precision and
// checking finiteness on the way.
//
//   grpc::ByteBuffer wire = SerializeWithPayload(header, /*field=*/8, PayloadSlice(grad));
//   ...
//   ReceivedPayload payload;
//   TESSERA_RETURN_IF_ERROR(ParseWithPayload(wire, 8, &header, &payload));
//   TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(dst, /*check_finite=*/true, "push to w/0"));
#ifndef TESSERA_COMMON_RPC_WIRE_PAYLOAD_H_
#define TESSERA_COMMON_RPC_WIRE_PAYLOAD_H_

#include <cstddef>
#include <string_view>
#include <vector>

#include <google/protobuf/message_lite.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/float_payload.h"

namespace tessera {

// A slice over `bytes` without copying; the memory must stay valid and unchanged until the call that sends
// it has completed.
grpc::Slice BorrowedBytesSlice(std::string_view bytes);

// `header` (whose payload field must be empty) followed by field `field_number` holding `payload`.
grpc::ByteBuffer SerializeWithPayload(const google::protobuf::MessageLite& header, int field_number,
                                      grpc::Slice payload);

// A payload received in gRPC's slices. Thread-compatible.
class ReceivedPayload final : public FloatPayload {
 public:
  size_t size() const override { return size_; }
  bool empty() const { return size_ == 0; }
  bool reads_in_place() const override;
  [[nodiscard]] absl::StatusOr<FloatPieces> Float32Pieces(size_t n, std::string_view what,
                                                          absl::Span<float> spill) const override;

 protected:
  void CopyBytesTo(char* out) const override;
  absl::Status CopyFloat32To(absl::Span<float> out, bool check_finite, std::string_view what) const override;

 private:
  friend absl::Status ParseWithPayload(const grpc::ByteBuffer&, int, google::protobuf::MessageLite*,
                                       ReceivedPayload*);
  std::vector<grpc::Slice> slices_;  // keeps the fragments' memory alive
  std::vector<std::string_view> fragments_;
  size_t size_ = 0;
};

// Parses `buffer` into `header` (every field but `field_number`) and `payload` (that field's bytes; the last
// occurrence wins, as in protobuf). INVALID_ARGUMENT for bytes that are not a well-formed message.
[[nodiscard]] absl::Status ParseWithPayload(const grpc::ByteBuffer& buffer, int field_number,
                                            google::protobuf::MessageLite* header, ReceivedPayload* payload);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_WIRE_PAYLOAD_H_

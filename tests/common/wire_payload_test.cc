#include "common/rpc/wire_payload.h"

#include <cstring>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "common/base/tensor_codec.h"
#include "proto/ps.pb.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using tessera::v1::PushRequest;

PushRequest Header() {
  PushRequest r;
  r.set_epoch(7);
  r.set_worker_id(3);
  r.set_seq(11);
  r.set_clock(5);
  r.set_batch_size(64);
  r.mutable_key()->set_param("layer0/weight");
  r.mutable_key()->set_index(2);
  return r;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string_view BytesOf(const std::vector<float>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)};
}

// Re-cuts `bytes` into slices of `piece` bytes, as a network read may deliver them.
grpc::ByteBuffer Recut(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) slices.emplace_back(bytes.substr(i, piece));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(WirePayloadTest, SerialisedMessageIsTheOrdinaryProtobufMessage) {
  std::vector<float> values = {1.5f, -2.0f, 3.25f};
  grpc::ByteBuffer wire =
      SerializeWithPayload(Header(), PushRequest::kDataFieldNumber, BorrowedBytesSlice(BytesOf(values)));
  PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(wire)));
  EXPECT_EQ(parsed.seq(), 11u);
  EXPECT_EQ(parsed.key().param(), "layer0/weight");
  ASSERT_EQ(parsed.data().size(), values.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(parsed.data().data(), values.data(), parsed.data().size()), 0);
}

TEST(WirePayloadTest, ParsesAMessageFromAnyProtobufWriterCutAnywhere) {
  PushRequest full = Header();
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  full.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  const std::string bytes = full.SerializeAsString();
  for (size_t piece : {1, 3, 7, 100, 4096, 100000}) {
    PushRequest header;
    ReceivedPayload payload;
    ASSERT_THAT(ParseWithPayload(Recut(bytes, piece), PushRequest::kDataFieldNumber, &header, &payload), IsOk())
        << piece;
    EXPECT_EQ(header.key().index(), 2);
    EXPECT_TRUE(header.data().empty()) << "the payload stays out of the header";
    std::vector<float> out(values.size());
    ASSERT_THAT(payload.CopyFloatsTo(absl::MakeSpan(out), true, "w"), IsOk());
    EXPECT_EQ(out, values) << piece;
  }
}

// A bfloat16 payload cut anywhere decodes to the values it encodes, and a wrong length is refused.
TEST(WirePayloadTest, DecodesABf16PayloadCutAnywhere) {
  std::vector<float> values(1001);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 256) - 128.0f;  // exact in BF16
  std::string encoded(values.size() * 2, '\0');
  EncodeValues(values, tessera::v1::WireSpec::BF16, encoded.data());
  PushRequest full = Header();
  full.set_data(encoded);
  WireEncoding bf16;
  bf16.precision = tessera::v1::WireSpec::BF16;
  for (size_t piece : {1, 3, 7, 100, 100000}) {
    PushRequest header;
    ReceivedPayload payload;
    ASSERT_THAT(ParseWithPayload(Recut(full.SerializeAsString(), piece), PushRequest::kDataFieldNumber, &header,
                                 &payload),
                IsOk());
    payload.set_encoding(bf16);
    std::vector<float> out(values.size());
    ASSERT_THAT(payload.CopyFloatsTo(absl::MakeSpan(out), true, "w"), IsOk());
    EXPECT_EQ(out, values) << piece;
    std::vector<float> fewer(values.size() - 1);
    EXPECT_THAT(payload.CopyFloatsTo(absl::MakeSpan(fewer), true, "push to w/0"),
                StatusIs(absl::StatusCode::kInvalidArgument, "expected 2000 bytes (1000 BF16 values), got 2002"));
  }
}

TEST(WirePayloadTest, WrongLengthAndNonFiniteValuesAreInvalidArguments) {
  std::vector<float> values = {1, 2, std::numeric_limits<float>::quiet_NaN(), 4};
  grpc::ByteBuffer wire = SerializeWithPayload(Header(), PushRequest::kDataFieldNumber, BorrowedBytesSlice(BytesOf(values)));
  PushRequest header;
  ReceivedPayload payload;
  ASSERT_THAT(ParseWithPayload(wire, PushRequest::kDataFieldNumber, &header, &payload), IsOk());
  std::vector<float> three(3), four(4);
  EXPECT_THAT(payload.CopyFloatsTo(absl::MakeSpan(three), true, "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 12 bytes (3 float32 values), got 16"));
  EXPECT_THAT(payload.CopyFloatsTo(absl::MakeSpan(four), true, "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "index 2"));
  EXPECT_THAT(payload.CopyFloatsTo(absl::MakeSpan(four), false, "assign"), IsOk());
}

// Float32 values are read where they were received: every cut gives the values, in pieces whose largest |value|
// is recorded; fragments holding whole aligned floats are used in place (nothing spilled), and a value split
// between fragments, or a fragment not aligned for floats, is copied into the spill.
TEST(WirePayloadTest, Float32PiecesAreTheValuesReadWhereTheyLie) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * (i % 2 ? -0.5f : 0.5f);
  PushRequest full = Header();
  full.set_data(std::string(BytesOf(values)));
  const std::string bytes = full.SerializeAsString();
  for (size_t piece : {1, 3, 7, 100, 4096, 100000}) {
    PushRequest header;
    ReceivedPayload payload;
    ASSERT_THAT(ParseWithPayload(Recut(bytes, piece), PushRequest::kDataFieldNumber, &header, &payload), IsOk());
    ASSERT_TRUE(payload.reads_in_place());
    std::vector<float> spill(values.size());
    absl::StatusOr<FloatPieces> pieces = payload.Float32Pieces(values.size(), "w", absl::MakeSpan(spill));
    ASSERT_THAT(pieces.status(), IsOk()) << piece;
    std::vector<float> out(values.size());
    pieces->CopyTo(absl::MakeSpan(out));
    EXPECT_EQ(out, values) << piece;
    EXPECT_EQ(pieces->MaxAbs(), 499.5f) << piece;
    EXPECT_THAT(payload.Float32Pieces(values.size() - 1, "push to w/0", absl::MakeSpan(spill)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "expected 3996 bytes (999 float32 values), got 4000"));
  }
  // The payload's own slice (as SerializeWithPayload sends it, and as most fragments arrive): read in place.
  grpc::ByteBuffer wire =
      SerializeWithPayload(Header(), PushRequest::kDataFieldNumber, BorrowedBytesSlice(BytesOf(values)));
  PushRequest header;
  ReceivedPayload payload;
  ASSERT_THAT(ParseWithPayload(wire, PushRequest::kDataFieldNumber, &header, &payload), IsOk());
  std::vector<float> spill(values.size(), -1.0f);
  absl::StatusOr<FloatPieces> pieces = payload.Float32Pieces(values.size(), "w", absl::MakeSpan(spill));
  ASSERT_THAT(pieces.status(), IsOk());
  EXPECT_EQ(spill, std::vector<float>(values.size(), -1.0f)) << "nothing spilled";
  ASSERT_EQ(pieces->pieces().size(), 1u);
  EXPECT_EQ(pieces->pieces()[0].values.data(), values.data()) << "not copied";
  // A non-finite value anywhere is refused, naming its index, whether it lies in place or was spilled.
  values[777] = std::numeric_limits<float>::infinity();
  full.set_data(std::string(BytesOf(values)));
  for (size_t piece : {5, 4096}) {
    ReceivedPayload bad;
    ASSERT_THAT(ParseWithPayload(Recut(full.SerializeAsString(), piece), PushRequest::kDataFieldNumber, &header,
                                 &bad),
                IsOk());
    EXPECT_THAT(bad.Float32Pieces(values.size(), "push to w/0", absl::MakeSpan(spill)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "index 777"));
  }
  // Other encodings are decoded into memory of their own.
  WireEncoding bf16;
  bf16.precision = tessera::v1::WireSpec::BF16;
  payload.set_encoding(bf16);
  EXPECT_FALSE(payload.reads_in_place());
  EXPECT_THAT(payload.Float32Pieces(values.size(), "w", absl::MakeSpan(spill)).status(), StatusIs(absl::StatusCode::kUnimplemented, "CopyFloatsTo"));
}

TEST(WirePayloadTest, MalformedBytesAreInvalidArguments) {
  const std::string good = Header().SerializeAsString();
  for (const std::string& bad : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                 good.substr(0, good.size() - 3), std::string("\x42\x80", 2),
                                 std::string("\x0b", 1)}) {
    PushRequest header;
    ReceivedPayload payload;
    grpc::Slice slice(bad);
    EXPECT_THAT(ParseWithPayload(grpc::ByteBuffer(&slice, 1), PushRequest::kDataFieldNumber, &header, &payload),
                StatusIs(absl::StatusCode::kInvalidArgument, "malformed"));
  }
}

TEST(WirePayloadTest, AllFiniteFindsEveryKindOfNonFiniteValueAnywhere) {
  std::vector<float> v(1037, 1.0f);
  EXPECT_TRUE(AllFinite(v));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t at : {size_t{0}, size_t{15}, size_t{1036}}) {
      std::vector<float> w = v;
      w[at] = bad;
      EXPECT_FALSE(AllFinite(w)) << at;
    }
  }
  v[5] = std::numeric_limits<float>::denorm_min();
  v[6] = std::numeric_limits<float>::max();
  EXPECT_TRUE(AllFinite(v));
}

}  // namespace
}  // namespace tessera

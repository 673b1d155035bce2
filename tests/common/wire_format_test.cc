#include "common/model/wire_format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/param_printers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using tessera::v1::WireSpec;

WireEncoding Dense(WirePrecision precision) {
  WireEncoding e;
  e.precision = precision;
  return e;
}

WireEncoding TopK(WirePrecision precision, float fraction) {
  WireEncoding e = Dense(precision);
  e.sparse = true;
  e.top_k = fraction;
  return e;
}

// The float value of each 16-bit pattern, through the decoder.
std::vector<float> DecodeAll16(WirePrecision precision, const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * 2);
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), bits.size() * 2, Dense(precision), "all"), IsOk());
  return out;
}

std::vector<uint16_t> Encode16(WirePrecision precision, const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  EncodeValues(values, precision, reinterpret_cast<char*>(bits.data()));
  return bits;
}

class SixteenBitTest : public ::testing::TestWithParam<WirePrecision> {};

// Every finite 16-bit value decodes to a float that encodes back to the same bits: decoding is exact and
// encoding is its inverse on representable values (subnormals and both zeros included).
TEST_P(SixteenBitTest, EveryFiniteValueRoundTrips) {
  const WirePrecision precision = GetParam();
  std::vector<uint16_t> bits;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t exponent_mask = precision == WireSpec::BF16 ? 0x7f80u : 0x7c00u;
    if ((h & exponent_mask) == exponent_mask) continue;  // infinities and NaNs
    bits.push_back(static_cast<uint16_t>(h));
  }
  const std::vector<float> values = DecodeAll16(precision, bits);
  for (float v : values) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(Encode16(precision, values), bits);
}

// Random floats in the format's range encode to the nearest representable value, ties to the even one.
TEST_P(SixteenBitTest, RoundsToNearestEven) {
  const WirePrecision precision = GetParam();
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(precision == WireSpec::BF16 ? -120 : -24,
                                              precision == WireSpec::BF16 ? 120 : 15);
  std::vector<float> values;
  for (int i = 0; i < 20000; ++i) values.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  const std::vector<uint16_t> bits = Encode16(precision, values);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = bits[i];
    // The neighbours one step away in magnitude (same sign).
    std::vector<uint16_t> around = {h, static_cast<uint16_t>(h + 1)};
    if ((h & 0x7fff) != 0) around.push_back(static_cast<uint16_t>(h - 1));
    const std::vector<float> candidates = DecodeAll16(precision, around);
    const double error = std::fabs(static_cast<double>(candidates[0]) - values[i]);
    for (size_t j = 1; j < candidates.size(); ++j) {
      if (!std::isfinite(candidates[j])) continue;
      const double other = std::fabs(static_cast<double>(candidates[j]) - values[i]);
      ASSERT_LE(error, other) << values[i];
      if (error == other) {
        EXPECT_EQ(h & 1, 0) << "a tie goes to the even value: " << values[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, SixteenBitTest, ::testing::Values(WireSpec::BF16, WireSpec::FP16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

TEST(WireFormatTest, MagnitudesBeyondTheRangeAreClampedNotInfinite) {
  const std::vector<float> big = {1e6f, -1e6f, std::numeric_limits<float>::max()};
  std::vector<float> half = DecodeAll16(WireSpec::FP16, Encode16(WireSpec::FP16, big));
  EXPECT_EQ(half, (std::vector<float>{65504.0f, -65504.0f, 65504.0f}));
  std::vector<float> bf16 = DecodeAll16(WireSpec::BF16, Encode16(WireSpec::BF16, big));
  EXPECT_TRUE(std::isfinite(bf16[2]));
  EXPECT_GT(bf16[2], 3e38f);
}

// With error feedback, what reached the server plus what the residual still owes is exactly what was pushed:
// rounding delays part of a gradient, it loses none. Without it, small gradients would vanish.
TEST(WireFormatTest, ErrorFeedbackLosesNothingOfTheGradients) {
  for (WireEncoding encoding : {Dense(WireSpec::BF16), Dense(WireSpec::FP16), TopK(WireSpec::BF16, 0.1f),
                                TopK(WireSpec::FP32, 0.01f)}) {
    const size_t n = 3000;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1e-3f);
    std::vector<float> residual(n, 0.0f);
    std::vector<double> pushed(n, 0.0), received(n, 0.0);
    std::vector<char> wire(MaxEncodedBytes(encoding, n));
    for (int step = 0; step < 200; ++step) {
      std::vector<float> grad(n);
      for (size_t i = 0; i < n; ++i) grad[i] = normal(rng) + (i % 7 == 0 ? 1.0f : 0.0f);  // large and tiny parts
      const EncodedGradient sent = EncodeGradient(grad, absl::MakeSpan(residual), encoding, wire.data());
      const size_t bytes = sent.bytes;
      ASSERT_LE(bytes, wire.size());
      ASSERT_EQ(sent.sparse, encoding.sparse);
      if (!encoding.sparse) ASSERT_EQ(bytes, wire.size());
      std::vector<float> out(n);
      std::memcpy(out.data(), wire.data(), bytes);
      WireEncoding as_sent = encoding;
      as_sent.sparse = sent.sparse;
      ASSERT_THAT(DecodeInPlace(absl::MakeSpan(out), bytes, as_sent, "push"), IsOk());
      for (size_t i = 0; i < n; ++i) {
        pushed[i] += grad[i];
        received[i] += out[i];
      }
    }
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(received[i] + residual[i] - pushed[i]) / std::max(1.0, std::fabs(pushed[i])));
    }
    EXPECT_LT(worst, 1e-4) << PrecisionName(encoding.precision) << (encoding.sparse ? " top-k" : "");
  }
}

TEST(WireFormatTest, TopKSendsTheLargestEntriesInIndexOrder) {
  const std::vector<float> grad = {0.1f, -5.0f, 0.2f, 3.0f, -0.3f, 0.0f, 4.0f, 0.05f, 0.0f, 0.0f};
  std::vector<float> residual(grad.size(), 0.0f);
  const WireEncoding encoding = TopK(WireSpec::FP32, 0.3f);  // 3 of 10
  std::vector<char> wire(MaxEncodedBytes(encoding, grad.size()));
  const EncodedGradient sent = EncodeGradient(grad, absl::MakeSpan(residual), encoding, wire.data());
  ASSERT_TRUE(sent.sparse);
  ASSERT_EQ(sent.bytes, 3u * 8u);
  std::vector<float> out(grad.size());
  std::memcpy(out.data(), wire.data(), 24);
  ASSERT_THAT(DecodeInPlace(absl::MakeSpan(out), 24, encoding, "push"), IsOk());
  EXPECT_EQ(out, (std::vector<float>{0, -5.0f, 0, 3.0f, 0, 0, 4.0f, 0, 0, 0}));
  EXPECT_EQ(residual, (std::vector<float>{0.1f, 0, 0.2f, 0, -0.3f, 0, 0, 0.05f, 0, 0}));
}

// A chunk so small that its top-k entries would take as many bytes as its values (a scalar, a parameter's short
// last chunk) goes dense, with its residual, and the decoder refuses top-k entries that long.
TEST(WireFormatTest, TinyChunksGoDenseUnderTopK) {
  for (WirePrecision precision : {WireSpec::FP32, WireSpec::BF16, WireSpec::FP16}) {
    for (size_t n : {1, 2, 3}) {
      const WireEncoding encoding = TopK(precision, 0.5f);
      std::vector<float> grad(n, 0.75f), residual(n, 0.25f);
      std::vector<char> wire(MaxEncodedBytes(encoding, n));
      const EncodedGradient sent = EncodeGradient(grad, absl::MakeSpan(residual), encoding, wire.data());
      EXPECT_FALSE(sent.sparse) << n;
      EXPECT_EQ(sent.bytes, n * BytesPerValue(precision));
      std::vector<float> out(n);
      std::memcpy(out.data(), wire.data(), sent.bytes);
      ASSERT_THAT(DecodeInPlace(absl::MakeSpan(out), sent.bytes, Dense(precision), "push"), IsOk());
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i] + residual[i], 1.0f) << n;
    }
  }
  std::vector<float> out(1);
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 8, TopK(WireSpec::FP32, 0.5f), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not top-k entries"));
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 2, Dense(static_cast<WirePrecision>(7)), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown precision 7"));
}

TEST(WireFormatTest, BadLengthsAndIndicesAreInvalidArguments) {
  std::vector<float> out(10);
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 18, Dense(WireSpec::BF16), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 20 bytes (10 BF16 values), got 18"));
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 7, TopK(WireSpec::FP32, 0.5f), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not top-k entries"));
  // Indices 3 then 2: not ascending.
  const uint32_t index[2] = {3, 2};
  std::memcpy(out.data(), index, 8);
  out[2] = 1.0f;
  out[3] = 2.0f;
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 16, TopK(WireSpec::FP32, 0.5f), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not ascending"));
  const uint32_t outside[1] = {10};
  std::memcpy(out.data(), outside, 4);
  EXPECT_THAT(DecodeInPlace(absl::MakeSpan(out), 8, TopK(WireSpec::FP32, 0.5f), "push to w/0"),
              StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
}

// Decoding in place (the bytes at the front of the values' own memory) equals decoding a copy, for lengths
// around the decoder's block size.
TEST(WireFormatTest, InPlaceDecodingMatchesForEveryLength) {
  for (size_t n : {0, 1, 1023, 1024, 1025, 4097}) {
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 256) - 128.0f;  // exact in both formats
    for (WirePrecision precision : {WireSpec::BF16, WireSpec::FP16}) {
      std::vector<float> out(n, -1.0f);
      if (n > 0) EncodeValues(values, precision, reinterpret_cast<char*>(out.data()));
      ASSERT_THAT(DecodeInPlace(absl::MakeSpan(out), n * 2, Dense(precision), "pull"), IsOk());
      EXPECT_EQ(out, values) << n << " " << PrecisionName(precision);
    }
  }
}

}  // namespace
}  // namespace tessera

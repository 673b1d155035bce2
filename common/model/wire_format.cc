#include "common/model/wire_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace {

using tessera::v1::WireSpec;

constexpr float kHalfMax = 65504.0f;

// bfloat16: the upper half of a float32, rounded to nearest even. Magnitudes that would round past the largest
// finite bfloat16 are clamped to it (so is NaN, which never reaches here: values are checked finite first).
// Integer operations only, so that loops over it vectorise.
inline uint16_t ToBf16(float f) {
  const uint32_t u = absl::bit_cast<uint32_t>(f);
  const auto magnitude = static_cast<int32_t>(u & 0x7fffffffu);
  const uint32_t clamped =
      (u & 0x80000000u) | static_cast<uint32_t>(magnitude > 0x7f7f7fff ? 0x7f7f7fff : magnitude);
  return static_cast<uint16_t>((clamped + 0x7fffu + ((clamped >> 16) & 1u)) >> 16);
}

inline float FromBf16(uint16_t h) { return absl::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, rounded to nearest even; magnitudes beyond the largest finite half are clamped to it.
inline uint16_t ToHalf(float f) {
  const uint32_t u = absl::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= absl::bit_cast<uint32_t>(kHalfMax)) return static_cast<uint16_t>(sign | 0x7bffu);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24. Adding 0.5, whose float ulp is 2^-24,
    // rounds it there (to nearest even), and the low bits are the half's.
    const float shifted = absl::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (absl::bit_cast<uint32_t>(shifted) - absl::bit_cast<uint32_t>(0.5f)));
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  magnitude += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

inline float FromHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * (1.0f / 16777216.0f);  // exact
    return absl::bit_cast<float>(sign | absl::bit_cast<uint32_t>(value));
  }
  if (exponent == 31) return absl::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return absl::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t To16(float f, WirePrecision precision) {
  return precision == WireSpec::BF16 ? ToBf16(f) : ToHalf(f);
}
inline float From16(uint16_t h, WirePrecision precision) {
  return precision == WireSpec::BF16 ? FromBf16(h) : FromHalf(h);
}

// Writes `value`'s encoding to `out` and returns what the receiver will read back.
inline float Put(float value, WirePrecision precision, char* out) {
  if (precision == WireSpec::FP32) {
    std::memcpy(out, &value, sizeof(float));
    return value;
  }
  const uint16_t h = To16(value, precision);
  std::memcpy(out, &h, sizeof(h));
  return From16(h, precision);
}

// The hot loops, in a version for AVX2 beside the baseline one where the compiler can pick at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TESSERA_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TESSERA_VECTOR_CLONES
#endif

// Branch-free, so the compiler vectorises it: the common case.
TESSERA_VECTOR_CLONES void EncodeBf16Gradient(const float* __restrict grad, float* __restrict residual,
                                              uint16_t* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float t = grad[i] + residual[i];
    const uint16_t h = ToBf16(t);
    out[i] = h;
    residual[i] = t - FromBf16(h);
  }
}

TESSERA_VECTOR_CLONES void EncodeBf16Values(const float* __restrict values, uint16_t* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = ToBf16(values[i]);
}

TESSERA_VECTOR_CLONES void DecodeBf16(const uint16_t* __restrict in, float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FromBf16(in[i]);
}

void EncodeDenseGradient(absl::Span<const float> grad, absl::Span<float> residual, WirePrecision precision,
                         char* out) {
  const size_t n = grad.size();
  float* r = residual.data();
  if (precision == WireSpec::BF16) {
    EncodeBf16Gradient(grad.data(), r, reinterpret_cast<uint16_t*>(out), n);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float t = grad[i] + r[i];
    r[i] = t - Put(t, precision, out + i * BytesPerValue(precision));
  }
}

size_t EncodeTopKGradient(absl::Span<const float> grad, absl::Span<float> residual, const WireEncoding& encoding,
                          char* out) {
  const size_t n = grad.size();
  const size_t k = TopKCount(encoding.top_k, n);
  for (size_t i = 0; i < n; ++i) residual[i] += grad[i];  // residual now holds everything owed
  if (k == 0) return 0;
  // The k entries of the largest magnitude, in index order.
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k - 1), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(residual[a]) > std::fabs(residual[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  std::memcpy(out, order.data(), k * sizeof(uint32_t));
  char* values = out + k * sizeof(uint32_t);
  const size_t width = BytesPerValue(encoding.precision);
  for (size_t j = 0; j < k; ++j) {
    float& owed = residual[order[j]];
    owed -= Put(owed, encoding.precision, values + j * width);
  }
  return k * (sizeof(uint32_t) + width);
}

// Widens `n` 16-bit values at the front of `out` to floats, from the back, a block at a time through a copy on
// the stack (the source and destination overlap).
void Widen16InPlace(absl::Span<float> out, WirePrecision precision) {
  constexpr size_t kBlock = 1024;
  uint16_t block[kBlock];
  const char* bytes = reinterpret_cast<const char*>(out.data());
  size_t end = out.size();
  while (end > 0) {
    const size_t begin = end > kBlock ? end - kBlock : 0;
    const size_t count = end - begin;
    std::memcpy(block, bytes + begin * sizeof(uint16_t), count * sizeof(uint16_t));
    float* dst = out.data() + begin;
    if (precision == WireSpec::BF16) {
      DecodeBf16(block, dst, count);
    } else {
      for (size_t i = 0; i < count; ++i) dst[i] = FromHalf(block[i]);
    }
    end = begin;
  }
}

}  // namespace

const char* PrecisionName(WirePrecision precision) {
  switch (precision) {
    case WireSpec::FP32:
      return "FP32";
    case WireSpec::BF16:
      return "BF16";
    case WireSpec::FP16:
      return "FP16";
    default:
      return "an unknown precision";
  }
}

size_t BytesPerValue(WirePrecision precision) { return precision == WireSpec::FP32 ? 4 : 2; }

size_t TopKCount(float top_k, size_t n) {
  if (n == 0) return 0;
  const auto k = static_cast<size_t>(std::llround(static_cast<double>(top_k) * static_cast<double>(n)));
  return std::clamp<size_t>(k, 1, n);
}

namespace {
// Whether top-k entries of `n` values are smaller than the dense values (else the chunk goes dense).
bool TopKIsSmaller(const WireEncoding& encoding, size_t n) {
  const size_t width = BytesPerValue(encoding.precision);
  return TopKCount(encoding.top_k, n) * (sizeof(uint32_t) + width) < n * width;
}
}  // namespace

size_t MaxEncodedBytes(const WireEncoding& encoding, size_t n) {
  if (!encoding.sparse || !TopKIsSmaller(encoding, n)) return n * BytesPerValue(encoding.precision);
  return TopKCount(encoding.top_k, n) * (sizeof(uint32_t) + BytesPerValue(encoding.precision));
}

void EncodeValues(absl::Span<const float> values, WirePrecision precision, char* out) {
  if (precision == WireSpec::FP32) {
    if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(float));
    return;
  }
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  if (precision == WireSpec::BF16) {
    EncodeBf16Values(values.data(), o, values.size());
  } else {
    for (size_t i = 0; i < values.size(); ++i) o[i] = ToHalf(values[i]);
  }
}

EncodedGradient EncodeGradient(absl::Span<const float> grad, absl::Span<float> residual, const WireEncoding& encoding,
                               char* out) {
  if (encoding.sparse && TopKIsSmaller(encoding, grad.size())) {
    return {EncodeTopKGradient(grad, residual, encoding, out), true};
  }
  if (encoding.precision == WireSpec::FP32) {  // exact: only what the residual held is owed, and it goes now
    for (size_t i = 0; i < grad.size(); ++i) {
      const float t = grad[i] + residual[i];
      residual[i] = 0.0f;
      std::memcpy(out + i * sizeof(float), &t, sizeof(float));
    }
    return {grad.size() * sizeof(float), false};
  }
  EncodeDenseGradient(grad, residual, encoding.precision, out);
  return {grad.size() * BytesPerValue(encoding.precision), false};
}

absl::Status DecodeInPlace(absl::Span<float> out, size_t bytes, const WireEncoding& encoding, std::string_view what) {
  if (!WireSpec::Precision_IsValid(encoding.precision)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": unknown precision ",
                                                   static_cast<int>(encoding.precision)));
  }
  const size_t n = out.size();
  const size_t width = BytesPerValue(encoding.precision);
  if (!encoding.sparse) {
    if (bytes != n * width) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": expected ", n * width, " bytes (", n, " ",
                                                     PrecisionName(encoding.precision), " values), got ", bytes));
    }
    if (width == 2) Widen16InPlace(out, encoding.precision);
    return absl::OkStatus();
  }
  const size_t entry = sizeof(uint32_t) + width;
  if (bytes % entry != 0 || bytes / entry > n || bytes >= n * width) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", bytes, " bytes are not top-k entries of ",
                                                   PrecisionName(encoding.precision), " values for ", n, " values"));
  }
  const size_t k = bytes / entry;
  // The entries lie in `out`'s memory, which the decoded values overwrite: copied out once, then scattered.
  std::vector<char> packed(bytes);
  if (bytes > 0) std::memcpy(packed.data(), out.data(), bytes);
  auto index = [&](size_t j) {
    uint32_t i;
    std::memcpy(&i, packed.data() + j * sizeof(uint32_t), sizeof(i));
    return i;
  };
  for (size_t j = 0; j < k; ++j) {
    if (index(j) >= n || (j > 0 && index(j) <= index(j - 1))) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": top-k index ", index(j), " at entry ", j,
                                                     " is out of range or not ascending (", n, " values)"));
    }
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const char* values = packed.data() + k * sizeof(uint32_t);
  for (size_t j = 0; j < k; ++j) {
    if (width == 4) {
      std::memcpy(&out[index(j)], values + j * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, values + j * 2, 2);
      out[index(j)] = From16(h, encoding.precision);
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera

#include "common/rpc/wire_payload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "glog/logging.h"

namespace tessera {
namespace {

constexpr int kLengthDelimited = 2;

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads a protobuf message spread over slices, byte by byte where needed and in spans where possible.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool done() const { return slice_ == slices_.size(); }

  bool ReadByte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }

  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // Calls visit(std::string_view) for each piece of the next `n` bytes; false if fewer remain.
  template <typename Visit>
  bool Take(uint64_t n, Visit visit) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t here = std::min<uint64_t>(n, s.size() - offset_);
      visit(std::string_view(reinterpret_cast<const char*>(s.begin()) + offset_, here));
      Advance(here);
      n -= here;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace

grpc::Slice BorrowedBytesSlice(std::string_view bytes) {
  return grpc::Slice(bytes.data(), bytes.size(), grpc::Slice::STATIC_SLICE);
}

grpc::ByteBuffer SerializeWithPayload(const google::protobuf::MessageLite& header, int field_number,
                                      grpc::Slice payload) {
  std::string head = header.SerializeAsString();
  AppendVarint((static_cast<uint64_t>(field_number) << 3) | kLengthDelimited, &head);
  AppendVarint(payload.size(), &head);
  const size_t payload_bytes = payload.size();
  grpc::Slice slices[2] = {grpc::Slice(head), std::move(payload)};
  return grpc::ByteBuffer(slices, payload_bytes == 0 ? 1 : 2);
}

absl::Status ParseWithPayload(const grpc::ByteBuffer& buffer, int field_number,
                              google::protobuf::MessageLite* header, ReceivedPayload* payload) {
  payload->slices_.clear();
  payload->fragments_.clear();
  payload->size_ = 0;
  grpc::Status dumped = buffer.Dump(&payload->slices_);
  if (!dumped.ok()) return absl::InvalidArgumentError("unreadable message bytes");
  SliceReader reader(payload->slices_);
  std::string rest;  // every other field, re-assembled for protobuf's parser (small)
  auto malformed = [&] {
    return absl::InvalidArgumentError(absl::StrCat("malformed ", header->GetTypeName(), " (", buffer.Length(),
                                                   " bytes)"));
  };
  auto append = [&rest](std::string_view piece) { rest.append(piece.data(), piece.size()); };
  while (!reader.done()) {
    uint64_t tag;
    if (!reader.ReadVarint(&tag) || (tag >> 3) == 0) return malformed();
    const int wire_type = static_cast<int>(tag & 7);
    if (static_cast<int64_t>(tag >> 3) == field_number && wire_type == kLengthDelimited) {
      uint64_t length;
      if (!reader.ReadVarint(&length)) return malformed();
      payload->fragments_.clear();
      payload->size_ = 0;
      if (!reader.Take(length, [&](std::string_view piece) {
            payload->fragments_.push_back(piece);
            payload->size_ += piece.size();
          })) {
        return malformed();
      }
      continue;
    }
    AppendVarint(tag, &rest);
    switch (wire_type) {
      case 0: {
        uint64_t v;
        if (!reader.ReadVarint(&v)) return malformed();
        AppendVarint(v, &rest);
        break;
      }
      case 1:
        if (!reader.Take(8, append)) return malformed();
        break;
      case kLengthDelimited: {
        uint64_t length;
        if (!reader.ReadVarint(&length) || length > buffer.Length()) return malformed();
        AppendVarint(length, &rest);
        if (!reader.Take(length, append)) return malformed();
        break;
      }
      case 5:
        if (!reader.Take(4, append)) return malformed();
        break;
      default:  // groups (3, 4) are not used by Tessera's messages
        return malformed();
    }
  }
  if (!header->ParseFromString(rest)) return malformed();
  return absl::OkStatus();
}

bool ReceivedPayload::reads_in_place() const {
  return !encoding().sparse && encoding().precision == tessera::v1::WireSpec::FP32;
}

absl::StatusOr<FloatPieces> ReceivedPayload::Float32Pieces(size_t n, std::string_view what,
                                                           absl::Span<float> spill) const {
  if (!reads_in_place()) return FloatPayload::Float32Pieces(n, what, spill);
  TESSERA_RETURN_IF_ERROR(CheckFloat32Length(n, what));
  CHECK_GE(spill.size(), n);
  FloatPieces pieces;
  float largest = 0.0f;
  // Each run of values is checked while it is still in cache, and taken only once all are: nothing non-finite
  // is applied.
  absl::Status bad;
  auto take = [&](absl::Span<const float> values) {
    if (!bad.ok() || values.empty()) return;
    const float m = MaxAbs(values);
    if (!std::isfinite(m)) {
      bad = CheckFinite(values, what, pieces.size());  // names the first bad index
      return;
    }
    largest = std::max(largest, m);
    pieces.Append(values);
  };
  // The values lie in place where a fragment holds whole floats at an address aligned for them; the rest (a
  // value split between two fragments, a fragment that is not aligned) is copied to the same offset of `spill`,
  // and consecutive spilled values form one run there.
  char* const spilled = reinterpret_cast<char*>(spill.data());
  size_t done = 0;  // bytes of the values seen
  std::optional<size_t> spill_begin;  // bytes: the spilled run not taken yet is [*spill_begin, done)
  auto take_spilled = [&] {
    if (!spill_begin) return;
    take(absl::MakeConstSpan(spill.data() + *spill_begin / sizeof(float), (done - *spill_begin) / sizeof(float)));
    spill_begin.reset();
  };
  for (std::string_view fragment : fragments_) {
    const char* p = fragment.data();
    size_t left = fragment.size();
    if (const size_t split = done % sizeof(float); split > 0) {
      // The rest of a value whose first bytes ended the last fragment (and so are spilled already).
      const size_t rest = std::min(left, sizeof(float) - split);
      std::memcpy(spilled + done, p, rest);
      p += rest;
      left -= rest;
      done += rest;
    }
    const size_t whole = left / sizeof(float);
    if (whole > 0 && reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
      take_spilled();
      take(absl::MakeConstSpan(reinterpret_cast<const float*>(p), whole));
      p += whole * sizeof(float);
      left -= whole * sizeof(float);
      done += whole * sizeof(float);
    }
    if (left > 0) {
      if (!spill_begin) spill_begin = done;  // a float boundary: a split value's first bytes start a run
      std::memcpy(spilled + done, p, left);
      done += left;
    }
  }
  take_spilled();
  TESSERA_RETURN_IF_ERROR(bad);
  pieces.set_max_abs(largest);
  return pieces;
}

void ReceivedPayload::CopyBytesTo(char* out) const {
  size_t done = 0;
  for (std::string_view fragment : fragments_) {
    std::memcpy(out + done, fragment.data(), fragment.size());
    done += fragment.size();
  }
}

absl::Status ReceivedPayload::CopyFloat32To(absl::Span<float> out, bool check_finite, std::string_view what) const {
  // Copy and check block by block, so each block is checked while it is still in cache.
  char* dst = reinterpret_cast<char*>(out.data());
  size_t done = 0;      // bytes copied
  size_t checked = 0;   // floats checked
  constexpr size_t kBlockFloats = 4096;
  for (std::string_view fragment : fragments_) {
    std::memcpy(dst + done, fragment.data(), fragment.size());
    done += fragment.size();
    if (!check_finite) continue;
    const size_t available = done / sizeof(float);
    while (checked < available) {
      const size_t n = std::min(kBlockFloats, available - checked);
      if (!AllFinite(out.subspan(checked, n))) {
        return CheckFinite(out.subspan(0, checked + n), what);  // names the first bad index
      }
      checked += n;
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera

#include "server/request_conversions.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/wire_limits.h"

namespace tessera {

using tessera::v1::PullRequest;
using tessera::v1::PushRequest;

absl::StatusOr<ChunkPush> ToChunkPush(const PushRequest& r, absl::string_view member_key) {
  if (!PushRequest::Kind_IsValid(r.kind())) {
    return absl::InvalidArgumentError(absl::StrCat("push kind ", static_cast<int>(r.kind()),
                                                   " is neither GRADIENT (0) nor ASSIGN (1)"));
  }
  ChunkPush push;
  push.address = {r.epoch(), r.key().param(), r.key().index()};
  push.worker_id = r.worker_id();
  push.incarnation = r.incarnation();
  push.seq = r.seq();
  push.clock = r.clock();
  push.read_clock_version = r.read_clock_version();
  push.batch_size = r.batch_size();
  push.assign = r.kind() == PushRequest::ASSIGN;
  if (r.has_lr_factor()) {
    if (!std::isfinite(r.lr_factor()) || r.lr_factor() < 0.0f || r.lr_factor() > kMaxLrFactor) {
      return absl::InvalidArgumentError(absl::StrCat("learning-rate factor ", r.lr_factor(), " must be within 0 .. ",
                                                     kMaxLrFactor));
    }
    push.lr_factor = r.lr_factor();
  }
  push.skip = r.skip();
  push.norm_only = r.norm_only();
  push.member_key = std::string(member_key);
  return push;
}

ChunkPull ToChunkPull(const PullRequest& r) {
  return ChunkPull{{r.epoch(), r.key().param(), r.key().index()}, r.have_version(), r.worker_id(),
                   r.reply_precision()};
}

WireEncoding EncodingOf(const PushRequest& r) {
  WireEncoding encoding;
  encoding.precision = r.data_precision();
  encoding.sparse = r.data_sparse();
  return encoding;
}

size_t DecodedBytes(const PushRequest& r, size_t wire_bytes) {
  if (r.data_sparse()) return SIZE_MAX;
  return wire_bytes / BytesPerValue(r.data_precision()) * sizeof(float);
}

void RunUpdate(ThreadPool* updates, size_t inline_update_bytes, const PushRequest& r, size_t wire_bytes,
               std::function<void()> apply) {
  if (DecodedBytes(r, wire_bytes) < inline_update_bytes) {
    apply();
  } else {
    updates->Submit(std::move(apply), r.priority());
  }
}

}  // namespace tessera

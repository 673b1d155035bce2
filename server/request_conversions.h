// What the gRPC adapter (server/server_service.h) and the UCX adapter (server/fabric_service.h) share: a data-plane
// request's wire message as the store's request, and where its update runs.
#ifndef TESSERA_SERVER_REQUEST_CONVERSIONS_H_
#define TESSERA_SERVER_REQUEST_CONVERSIONS_H_

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/thread_pool.h"
#include "common/model/wire_format.h"
#include "proto/ps.pb.h"
#include "server/chunk_requests.h"

namespace tessera {

// The store's view of a push request (its key points into `r`), made with the caller's member key.
// INVALID_ARGUMENT for a kind that is neither GRADIENT nor ASSIGN, or a learning-rate factor out of bounds.
[[nodiscard]] absl::StatusOr<ChunkPush> ToChunkPush(const tessera::v1::PushRequest& r, absl::string_view member_key);
// The store's view of a pull request (its key points into `r`).
ChunkPull ToChunkPull(const tessera::v1::PullRequest& r);
// How a push request's values are encoded.
WireEncoding EncodingOf(const tessera::v1::PushRequest& r);

// The bytes push `r`'s values take once decoded into float32, from the `wire_bytes` they took on the wire; for
// top-k entries, whose chunk's length is not known here, SIZE_MAX.
size_t DecodedBytes(const tessera::v1::PushRequest& r, size_t wire_bytes);

// Runs `apply` (push `r`'s update, whose values took `wire_bytes`) on `updates` when the push carries at least
// `inline_update_bytes` of float32 values once decoded (top-k pushes always), else on the calling thread (small
// updates take microseconds). On the pool, pushes of earlier layers (a lower r.priority()) go first: the next
// forward pass needs them first.
void RunUpdate(ThreadPool* updates, size_t inline_update_bytes, const tessera::v1::PushRequest& r, size_t wire_bytes,
               std::function<void()> apply);

}  // namespace tessera

#endif  // TESSERA_SERVER_REQUEST_CONVERSIONS_H_

// The rows of embedding tables as PsClient offers them (PullRows, PushRows): ids deduplicated (a repeated id
// travels once; a push sums its rows first), routed to the primaries of their hash slots (row_calls.h), and
// retried as every call of the client is (call_retries.h) until each id's call succeeded.
#ifndef TESSERA_WORKER_CLIENT_ROW_CLIENT_H_
#define TESSERA_WORKER_CLIENT_ROW_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/shard_map.h"
#include "proto/ps.pb.h"
#include "worker/client/call_retries.h"
#include "worker/client/row_calls.h"

namespace tessera {

// What a push of rows did.
struct RowsPushed {
  int64_t updated = 0;  // row updates applied
  int64_t refused = 0;  // rows not admitted yet (their gradients dropped)
  bool late = false;    // SYNC: a round closed without this push (backup workers); nothing applied
};

// Not thread-safe, as PsClient.
class RowClient {
 public:
  // `view` is the client's current view (read at every attempt: a refresh replaces it); `retries` (not owned)
  // outlives this.
  RowClient(std::unique_ptr<RowCaller> caller, CallRetries* retries, const std::shared_ptr<const ShardMapIndex>& view);

  // Fills `out` with the rows of `ids` (see PsClient::PullRows). Returns the value bytes that travelled.
  absl::StatusOr<int64_t> Pull(const std::string& table, absl::Span<const uint64_t> ids, absl::Span<float> out,
                               int64_t clock, const CallerIdentity& who);

  // Sends `grads` of the rows of `ids` with `request`'s seq, clock, batch size, lr factor and skip (see
  // PsClient::PushRows); `every_server` (SYNC): every server of the table gets a call, with no ids where none
  // are its own, so that it knows the worker's round.
  absl::StatusOr<RowsPushed> Push(tessera::v1::RowPushRequest request, absl::Span<const uint64_t> ids,
                              absl::Span<const float> grads, bool every_server, const CallerIdentity& who);

 private:
  // The routes of the ids still to do, made for each attempt; `call` makes one call per route and returns their
  // statuses.
  using Calls = std::function<std::vector<absl::Status>(const ShardMapIndex& map, const RowTable& table,
                                                        const std::vector<RowRoute>& routes)>;
  absl::Status Run(const std::string& table, absl::Span<const uint64_t> ids, const Calls& call, bool every_server);

  const std::unique_ptr<RowCaller> caller_;
  CallRetries* const retries_;
  const std::shared_ptr<const ShardMapIndex>& view_;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_ROW_CLIENT_H_

// The seam between the client library and what carries its chunk calls. One ChunkCall is one chunk's pull,
// push, assign or exchange, described without the transport; a ChunkTransport moves it: gRPC (the default,
// with TLS: grpc_chunk_transport.h) or UCX on a trusted fabric (ucx_chunk_transport.h). The control plane
// (scheduler, registration, views) is gRPC whatever carries the chunks.
#ifndef TESSERA_WORKER_CLIENT_CHUNK_TRANSPORT_H_
#define TESSERA_WORKER_CLIENT_CHUNK_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/buffer_pool.h"
#include "common/model/shard_map.h"
#include "proto/ps.pb.h"
#include "worker/client/chunk_types.h"

namespace tessera {

class ChunkTransport;

// What a transport keeps for one call until it completes.
struct ChunkCallWire {
  virtual ~ChunkCallWire() = default;
};

// One chunk's call: what to send and where its answer goes. Owned by a ChunkBatch until it completed.
struct ChunkCall {
  ChunkOp op = kPull;
  // The map the call was made from, kept alive with it: a step's calls outlive a refresh of the client's map.
  std::shared_ptr<const ShardMapIndex> map;
  const tessera::v1::ChunkPlacement* placement = nullptr;  // in `map`
  size_t name_index = 0;  // in the caller's list of names
  // The parameter's position in the model (the declaration order, first layer 0): lower goes first at a busy
  // server and in the caller's queues.
  uint32_t priority = 0;
  int server_id = 0;
  std::string server;     // the server's address, naming it in errors
  // The request, of one kind a call (the first access of a mutable accessor makes it that kind): kPull a pull;
  // push, assign, exchange and norm a push, without its values (`src`); kRowPull a pull of rows (`placement` is
  // null for rows); kRowPush a push of rows, without its gradients (`src`).
  std::variant<std::monostate, tessera::v1::PullRequest, tessera::v1::PushRequest, tessera::v1::RowPullRequest,
               tessera::v1::RowPushRequest>
      request;
  tessera::v1::PullRequest& pull() { return Request<tessera::v1::PullRequest>(); }
  const tessera::v1::PullRequest& pull() const { return std::get<tessera::v1::PullRequest>(request); }
  tessera::v1::PushRequest& push() { return Request<tessera::v1::PushRequest>(); }
  const tessera::v1::PushRequest& push() const { return std::get<tessera::v1::PushRequest>(request); }
  tessera::v1::RowPullRequest& row_pull() { return Request<tessera::v1::RowPullRequest>(); }
  const tessera::v1::RowPullRequest& row_pull() const { return std::get<tessera::v1::RowPullRequest>(request); }
  tessera::v1::RowPushRequest& row_push() { return Request<tessera::v1::RowPushRequest>(); }
  const tessera::v1::RowPushRequest& row_push() const { return std::get<tessera::v1::RowPushRequest>(request); }
  // Push, assign, exchange: the bytes to send, in push.data_precision (the caller's float32 values, or an
  // encoding of them that `src_owner` holds).
  std::string_view src;
  std::shared_ptr<const PooledBuffer> src_owner;
  absl::Span<float> dst;          // pull, exchange: where the chunk's values go (decoded from the reply's precision)
  absl::Duration timeout = absl::Seconds(30);
  ChunkTransport* transport = nullptr;  // not owned
  std::unique_ptr<ChunkCallWire> wire;
  // Filled on completion.
  absl::Status status;
  int64_t version = -1;
  int64_t clock_version = 0;
  bool skipped = false;
  double round_sq_norm = 0;  // kNorm: the squared norm of the round's mean gradient on this chunk  // SYNC: the round these values close applied no update (PullResponse.skipped)
  int64_t bytes = 0;  // value bytes received
  tessera::v1::RowPushResponse rows_pushed;  // kRowPush: the server's answer

  // What the call is for: a dense chunk (its parameter and index), or, for the rows of an embedding table, which
  // go to a server rather than to one of its slots, the table and the server.
  std::pair<std::string, int> key() const {
    if (placement != nullptr) return {placement->param(), placement->index()};
    return {op == kRowPush ? row_push().table() : row_pull().table(), server_id};
  }
  std::string What() const;

 private:
  template <typename T>
  T& Request() {
    if (T* held = std::get_if<T>(&request)) return *held;
    return request.template emplace<T>();
  }
};

// Carries chunk calls to the servers. Prepare runs on the caller's thread; Start and Cancel from any thread.
class ChunkTransport {
 public:
  virtual ~ChunkTransport() = default;
  // "grpc" or "ucx".
  virtual const char* name() const = 0;
  // Readies `call` (its request and spans filled) for Start, as `who`. An error ends the call unstarted.
  [[nodiscard]] virtual absl::Status Prepare(ChunkCall& call, const CallerIdentity& who) = 0;
  // Starts a prepared call. `done` runs once, on a transport thread, when the call completed: its status,
  // version, clock_version and bytes set and the values in `dst`. The call, `src` and `dst` must stay valid
  // until then. A failure of the server's process or connection is UNAVAILABLE, as for every transport.
  virtual void Start(ChunkCall* call, std::function<void()> done) = 0;
  // Ends a started call early (CANCELLED) unless it completed; `done` still runs once.
  virtual void Cancel(ChunkCall* call) = 0;
  // The client took a new cluster view: connections to servers no longer in it may be given up on (their calls
  // then end UNAVAILABLE and are retried where the view says).
  virtual void OnView(const ShardMapIndex& map) {}
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_CHUNK_TRANSPORT_H_

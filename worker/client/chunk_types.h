// What the client library says about one chunk call, whatever carries it: the operation, the stamp that makes a
// push apply once and in its round, who calls, and what the caller last pulled.
#ifndef TESSERA_WORKER_CLIENT_CHUNK_TYPES_H_
#define TESSERA_WORKER_CLIENT_CHUNK_TYPES_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace tessera {

// What one chunk RPC does.
// kNorm: a gradient for the chunk's norm round (PushRequest.norm_only), answered with the round's squared norm
// once every worker sent theirs; sent as an exchange, it receives no values.
// kRowPull, kRowPush: rows of an embedding table on one server (RowPullRequest, RowPushRequest), over the fabric
// transport only (worker/client/row_calls.h; gRPC carries rows through their own stubs).
enum ChunkOp { kPull = 0, kPush = 1, kAssign = 2, kExchange = 3, kNorm = 4, kRowPull = 5, kRowPush = 6 };

// What a push carries to be applied once and in the right round: its sequence number and clock. A retry
// carries its original's, even when the client's clock moved on since (a step's exchange retried while the
// next step runs).
struct Stamp {
  uint64_t seq = 0;
  int64_t clock = 0;
  // Gradients only: what the push says of its step besides the gradient (PushRequest.lr_factor, negative: not
  // sent, the job's rate; and skip).
  float lr_factor = -1.0f;
  bool skip = false;
};

// Who makes the calls: every request names the worker, and pushes carry its incarnation and key.
struct CallerIdentity {
  int worker_id = -1;
  uint64_t incarnation = 0;
  std::string member_key;
};

// What the last pull of a chunk returned, and where its bytes were written. A pull into the same memory names
// that version, and a server whose chunk has not changed since answers with no bytes.
struct PulledChunk {
  int64_t version = -1;
  int64_t clock_version = 0;
  const float* where = nullptr;
};
using PulledChunks = std::map<std::pair<std::string, int>, PulledChunk>;

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_CHUNK_TYPES_H_

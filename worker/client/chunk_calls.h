// The client library's data plane: one call per parameter chunk (pull, push, assign or push-pull), made from a
// shard map and sent at most `window` per server through a ChunkTransport (chunk_transport.h), which writes the
// answers straight into the caller's memory. PsClient and the step protocols program against ChunkCaller and
// ChunkBatch, whatever the transport.
#ifndef TESSERA_WORKER_CLIENT_CHUNK_CALLS_H_
#define TESSERA_WORKER_CLIENT_CHUNK_CALLS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/rpc/buffer_pool.h"
#include "common/model/shard_map.h"
#include "common/base/thread_pool.h"
#include "common/model/wire_format.h"
#include "worker/client/chunk_transport.h"
#include "worker/client/chunk_types.h"

namespace tessera {

// Makes chunk calls over one transport, in the job's wire precision (JobSpec.wire): gradients are encoded with
// error feedback (each chunk's residual carried into its next gradient; a retry of a push sends the bytes its
// original sent), pulls and exchanges ask for values in the job's precision. Not thread-safe: one client's loop
// uses it.
class ChunkCaller {
 public:
  explicit ChunkCaller(std::unique_ptr<ChunkTransport> transport,
                       const tessera::v1::WireSpec& wire = tessera::v1::WireSpec());

  ChunkTransport& transport() { return *transport_; }

  // The calls, one per chunk, of parameter `name` (index `name_index` of the caller's list) for `op` in `map`:
  // `grad` is sent (push, assign, exchange) and `out` receives (pull, exchange). INVALID_ARGUMENT for a span
  // of another size than the parameter; NOT_FOUND for an undeclared name; UNAVAILABLE for a chunk on a server
  // the view no longer has (it is moving: retry once the view says where). A pull into the memory `pulled`
  // says it holds names that version. Only the chunks that lie wholly within values [begin, end) of the
  // parameter get calls (a gradient that leaves a block at a time).
  absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> Make(
      ChunkOp op, const std::shared_ptr<const ShardMapIndex>& map, size_t name_index, const std::string& name,
      absl::Span<const float> grad, int batch_size, absl::Span<float> out, Stamp stamp, const CallerIdentity& who,
      const PulledChunks& pulled, absl::Duration timeout, size_t begin = 0, size_t end = SIZE_MAX);

  // Forgets every chunk's residual (a SYNC rollback voided the steps it came from).
  void ForgetResiduals() { feedback_.clear(); }

 private:
  // What error feedback keeps for one chunk: the residual, and the last encoding sent (reused by retries).
  struct Feedback {
    std::vector<float> residual;
    uint64_t seq = 0;
    std::shared_ptr<const PooledBuffer> sent;
    size_t length = 0;
    bool sparse = false;  // the bytes are top-k entries
  };

  // Points `call` at the bytes of gradient `grad` (one chunk of it) for push seq `seq`.
  void EncodeGradientOf(ChunkCall& call, absl::Span<const float> grad, uint64_t seq);

  const std::unique_ptr<ChunkTransport> transport_;
  const WireEncoding gradients_;
  const WirePrecision values_;
  std::map<std::pair<std::string, int>, Feedback> feedback_;
  BufferPool buffers_;
};

// The chunk calls of one call or step: at most `window` in flight per server, the rest queued by priority.
// Replies are written on the transport's threads, straight into the destination spans. Thread-safe.
class ChunkBatch {
 public:
  // With `launcher` (not owned; must outlive the batch), calls are started there instead of on the adding
  // thread: starting a call writes its bytes to the socket, which a training loop should not wait for.
  explicit ChunkBatch(int window, ThreadPool* launcher = nullptr) : window_(window), launcher_(launcher) {}
  ~ChunkBatch();

  // Starts `call` now, or queues it behind calls of higher priority to a busy server.
  void Add(std::unique_ptr<ChunkCall> call);
  // Waits until every added call completed (each has a deadline of its own). When `give_up` (asked at least
  // every 100 ms, without the batch's lock held) returns true, the calls still running are cancelled first.
  void WaitAll(const std::function<bool()>& give_up = nullptr);
  // Waits until every call of parameter `name_index` completed (true), or `give_up` returns true (false;
  // asked whenever a call completes and at least every 100 ms, without the batch's lock held).
  bool WaitForName(size_t name_index, const std::function<bool()>& give_up);
  // The calls of parameter `name_index` (valid once WaitForName returned true for it).
  std::vector<ChunkCall*> CallsOf(size_t name_index);
  // Every call added (valid once WaitAll returned).
  std::vector<ChunkCall*> calls();
  void CancelAll();

 private:
  struct Server {
    int in_flight = 0;
    std::multimap<size_t, ChunkCall*> queue;
  };

  void Launch(ChunkCall* c);
  // On a transport thread.
  void OnDone(ChunkCall* c);

  const int window_;
  ThreadPool* const launcher_;  // not owned; null: calls start on the adding thread
  absl::Mutex mu_;
  absl::CondVar call_done_;
  std::vector<std::unique_ptr<ChunkCall>> calls_ ABSL_GUARDED_BY(mu_);
  std::map<int, Server> servers_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<size_t, int> pending_by_name_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_CHUNK_CALLS_H_

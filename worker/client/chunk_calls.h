// The client library's data plane: one RPC per parameter chunk (pull, push, assign or push-pull), made from a
// shard map, sent over gRPC's callback API at most `window` per server, and decoded on gRPC's threads straight
// into the caller's memory. This is the one part of the client library that knows the transport; PsClient and
// the step protocols program against ChunkCaller and ChunkBatch.
#ifndef TESSERA_WORKER_CLIENT_CHUNK_CALLS_H_
#define TESSERA_WORKER_CLIENT_CHUNK_CALLS_H_

#include <grpcpp/generic/generic_stub.h>

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
#include "common/rpc.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/thread_pool.h"
#include "worker/client/chunk_types.h"

namespace tessera {

// One chunk's RPC: owns everything the callback API needs until the call completes.
struct ChunkCall {
  ChunkOp op = kPull;
  // The map the call was made from, kept alive with it: a step's calls outlive a refresh of the client's map.
  std::shared_ptr<const ShardMapIndex> map;
  const tessera::v1::ChunkPlacement* placement = nullptr;  // in `map`
  size_t name_index = 0;  // also the priority: lower goes first at a busy server
  int server_id = 0;
  std::string server;
  grpc::GenericStub* stub = nullptr;  // one of the server's connections
  absl::Span<float> dst;  // pull and exchange: where the chunk's values go
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  // Filled on completion.
  absl::Status status;
  int64_t version = -1;
  int64_t clock_version = 0;
  int64_t bytes = 0;  // value bytes received

  std::pair<std::string, int> key() const { return {placement->param(), placement->index()}; }
  std::string What() const;
};

// Makes chunk calls; holds the connections to the servers (connections_per_server per address, by lane).
// Not thread-safe: one client's loop uses it.
class ChunkCaller {
 public:
  ChunkCaller(std::shared_ptr<const Security> security, int connections_per_server)
      : security_(security),
        connections_per_server_(connections_per_server),
        stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
          return std::make_unique<grpc::GenericStub>(channel);
        }) {}

  // The calls, one per chunk, of parameter `name` (index `name_index` of the caller's list) for `op` in `map`:
  // `grad` is sent (push, assign, exchange) and `out` receives (pull, exchange). INVALID_ARGUMENT for a span
  // of another size than the parameter; NOT_FOUND for an undeclared name; UNAVAILABLE for a chunk on a server
  // the view no longer has (it is moving: retry once the view says where). A pull into the memory `pulled`
  // says it holds names that version.
  absl::StatusOr<std::vector<std::unique_ptr<ChunkCall>>> Make(
      ChunkOp op, const std::shared_ptr<const ShardMapIndex>& map, size_t name_index, const std::string& name,
      absl::Span<const float> grad, int batch_size, absl::Span<float> out, Stamp stamp, const CallerIdentity& who,
      const PulledChunks& pulled, absl::Duration timeout);

 private:
  grpc::GenericStub* StubFor(const ShardMapIndex& map, int server_id, int lane);

  const std::shared_ptr<const Security> security_;
  const int connections_per_server_;
  StubCache<grpc::GenericStub> stubs_;  // by address and lane: a connection each
};

// The chunk RPCs of one call or step: at most `window` in flight per server, the rest queued by priority.
// Replies are decoded on gRPC's threads, straight into the destination spans. Thread-safe.
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
  // On a gRPC thread.
  void OnDone(ChunkCall* c, const grpc::Status& status);

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

// The UCX adapter of a parameter server (jobs with transport: UCX on a trusted network): the data plane's pull,
// push and exchange as active messages (proto/ps.proto: FabricHello, FabricRequest, FabricReply), served from
// the same store as the gRPC service (server_service.h), with the same statuses.
//
// No port of its own: the service's UCX worker listens on no TCP port unless the server was started with
// --fabric_tcp (FabricOptions::tcp). A worker connects to the worker address the server registered, which the
// cluster view carries to the job's members only (ServerInfo.fabric_address), so the set-up travels over the
// authenticated control plane and no peer reaches UCX's connection code by knocking on a port.
//
// Every connection is authenticated before any value moves: its first message carries the job token and the
// worker's member key, checked as gRPC calls and pushes are; until the server accepted them, every request on
// the connection is refused UNAUTHENTICATED. Pushes on a connection are taken as its worker's only.
//
// A push's values are received into a pooled buffer (straight from the sender's memory when UCX uses
// rendezvous), applied on the update pool when large, and a reply's values are sent from the chunk's pooled
// reply buffer. All UCX calls run on the service's progress thread (common/fabric/ucx_worker.h).
#ifndef TESSERA_SERVER_FABRIC_SERVICE_H_
#define TESSERA_SERVER_FABRIC_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/rpc/buffer_pool.h"
#include "common/fabric/ucx_worker.h"
#include "common/rpc/security.h"
#include "common/base/thread_pool.h"
#include "proto/ps.pb.h"
#include "server/shard_store.h"

namespace tessera {

class FabricService {
 public:
  // Starts UCX. `store` and `updates` are not owned and must outlive the service; pushes of at least
  // `inline_update_bytes` are applied on `updates`. `options`: UCX's polling and whether it may use TCP
  // (common/fabric/ucx_worker.h). UNAVAILABLE when UCX cannot start.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FabricService>> Start(
      ShardStore* store, ThreadPool* updates, size_t inline_update_bytes, std::shared_ptr<const Security> security,
      FabricOptions options = {});
  // Closes every connection.
  ~FabricService();

  // The worker address the server registers (base64; common/fabric/ucx_worker.h EncodeFabricAddress).
  std::string address() const;
  // Row pulls and pushes served (FabricRequest ROW_PULL, ROW_PUSH), answered or refused.
  int64_t row_requests() const { return row_requests_.load(); }

  // Accepted connections at most (one per worker and server is the usual count).
  static constexpr size_t kMaxConnections = 4096;

 private:
  // A connection whose hello carried the job token and the worker's member key.
  struct Connection {
    ucp_ep_h ep = nullptr;
    int worker_id = -1;
    std::string member_key;
  };

  FabricService(ShardStore* store, ThreadPool* updates, size_t inline_update_bytes,
                std::shared_ptr<const Security> security)
      : store_(store), updates_(updates), inline_update_bytes_(inline_update_bytes), security_(std::move(security)) {}

  // Progress thread.
  void Close(ucp_ep_h ep);
  // Sends `reply` on `ep`, connection or not (a refusal).
  void SendReply(ucp_ep_h ep, const tessera::v1::FabricReply& reply);
  // Sends `reply` and `values`' first `length` bytes (none when null), counted in sends_in_flight_.
  void Send(ucp_ep_h ep, const tessera::v1::FabricReply& reply, std::shared_ptr<const PooledBuffer> values,
            size_t length);
  ucs_status_t OnHello(const void* header, size_t header_length, void* data, const ucp_am_recv_param_t* param);
  ucs_status_t OnRequest(const void* header, size_t header_length, void* data, size_t length,
                         const ucp_am_recv_param_t* param);
  // A pull of rows whose ids are in `data`, answered with their values.
  void PullRowsOf(ucp_ep_h ep, const tessera::v1::FabricRequest& request, const PooledBuffer& data);
  // A push of rows whose ids and gradients are `data`'s first `length` bytes: applies it (on the update pool when
  // large) and answers.
  void PushRowsOf(ucp_ep_h ep, const Connection& c, std::shared_ptr<const tessera::v1::FabricRequest> request,
                  std::shared_ptr<PooledBuffer> data, size_t length);
  // A push's values are in `values`: applies it (on the update pool when large) and answers.
  void Apply(ucp_ep_h ep, std::shared_ptr<const tessera::v1::FabricRequest> request,
             std::shared_ptr<PooledBuffer> values, size_t length);

  // Any thread: sends `reply` (and `values`' first `length` bytes) on `ep`, if it is still connected.
  void Reply(ucp_ep_h ep, tessera::v1::FabricReply reply, std::shared_ptr<const PooledBuffer> values = nullptr,
             size_t length = 0);

  ShardStore* const store_;
  ThreadPool* const updates_;
  const size_t inline_update_bytes_;
  const std::shared_ptr<const Security> security_;
  BufferPool buffers_;  // received push values
  std::atomic<int64_t> row_requests_{0};
  std::unique_ptr<UcxWorker> worker_;
  // Progress thread only: replies whose send has not completed (drained before the endpoints close), and
  // whether the service is stopping (requests are then answered UNAVAILABLE).
  int sends_in_flight_ = 0;
  bool stopping_ = false;
  std::unordered_map<ucp_ep_h, Connection> connections_;  // progress thread only
};

}  // namespace tessera

#endif  // TESSERA_SERVER_FABRIC_SERVICE_H_

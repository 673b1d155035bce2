// Chunk calls over UCX (transport: UCX, on a trusted network): shared memory or cross-memory attach between
// processes of one host, TCP or RDMA between hosts, as UCX chooses at run time.
//
// Each call is one active message to the server's UCX worker (its address is in the shard map, which only the
// job's members receive; no port is knocked on), answered by one. A push's values leave the caller's memory without a copy, and a large reply's values are received
// straight into the destination (UCX rendezvous). One connection per server, made on first use: its first
// message carries the job token and the worker's member key, and no chunk call goes out before the server
// accepted them. A lost connection or server fails the calls on it UNAVAILABLE, which the client library
// retries after the view changes, as for gRPC. UCX does not watch its peers here (so that it may use shared
// memory), so while calls to a server wait the transport probes the server's gRPC port: a server process that
// died fails its calls UNAVAILABLE within a few hundred milliseconds rather than at their deadlines.
#ifndef TESSERA_WORKER_CLIENT_UCX_CHUNK_TRANSPORT_H_
#define TESSERA_WORKER_CLIENT_UCX_CHUNK_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/fabric/port_probe.h"
#include "common/fabric/ucx_worker.h"
#include "common/rpc/security.h"
#include "worker/client/chunk_transport.h"

namespace tessera {

class UcxChunkTransport final : public ChunkTransport {
 public:
  // Starts UCX for caller `who`; `options` as for UcxWorker::Start. UNAVAILABLE when UCX cannot start here.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxChunkTransport>> Start(
      std::shared_ptr<const Security> security, CallerIdentity who, FabricOptions options = {});
  // Calls still running end CANCELLED.
  ~UcxChunkTransport() override;

  const char* name() const override { return "ucx"; }
  absl::Status Prepare(ChunkCall& call, const CallerIdentity& who) override;
  void Start(ChunkCall* call, std::function<void()> done) override;
  void Cancel(ChunkCall* call) override;
  // Closes the connections to fabric addresses the view no longer has (a lost or replaced server): UCX's
  // endpoints here do not watch their peer (so that UCX may use shared memory), so the view says who is gone.
  void OnView(const ShardMapIndex& map) override;

 private:
  struct Endpoint {
    std::string address;  // the server's UCX worker address, base64
    std::string server;   // "server N at HOST:PORT"
    std::unique_ptr<PortProbe> probe;  // of the server's gRPC port: whether the process is still there
    ucp_ep_h ep = nullptr;
    bool ready = false;             // the server accepted the hello
    std::vector<uint64_t> waiting;  // calls to send once it has
  };
  struct Wire;

  UcxChunkTransport(std::shared_ptr<const Security> security, CallerIdentity who)
      : security_(std::move(security)), who_(std::move(who)) {}

  // Any thread: fails call `id` (CANCELLED) on the progress thread, unless it completed.
  void CancelOnThread(uint64_t id);
  // The rest runs on the progress thread.
  void StartOnThread(ChunkCall* call);
  // The connection to `address`, made (and its hello sent) when there is none.
  absl::StatusOr<Endpoint*> EndpointFor(const std::string& address, const std::string& server,
                                        const std::string& grpc_address);
  void SendRequest(ChunkCall* call);
  // The call ends with `status` unless its outcome is known; what UCX still does for it is cancelled.
  void Fail(ChunkCall* call, const absl::Status& status);
  // Completes the call once its outcome is known and UCX is done with its memory.
  void MaybeFinish(ChunkCall* call);
  // A reply's values arrived at the front of the call's destination: decodes them there.
  static void Decode(ChunkCall* call);
  ChunkCall* Find(uint64_t id);
  // Fails every call of the connection and closes it.
  void Drop(Endpoint* endpoint, const absl::Status& why);
  // Every tick: calls past their deadline fail, and a server whose calls wait is probed (a dead one's calls
  // fail UNAVAILABLE at once, which the client library reports to the scheduler).
  void CheckDeadlines();
  ucs_status_t OnReply(const void* header, size_t header_length, void* data, size_t length,
                       const ucp_am_recv_param_t* param);

  const std::shared_ptr<const Security> security_;
  const CallerIdentity who_;
  std::unique_ptr<UcxWorker> worker_;
  std::atomic<uint64_t> next_id_{1};
  // Progress thread only.
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints_;  // by fabric address
  std::unordered_map<uint64_t, ChunkCall*> calls_;              // started, not completed, by request id
  std::unordered_map<uint64_t, Endpoint*> hellos_;              // hellos not answered yet, by request id
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_UCX_CHUNK_TRANSPORT_H_

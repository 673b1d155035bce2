#include "worker/client/ucx_chunk_transport.h"

#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fabric/active_messages.h"
#include "common/model/wire_format.h"
#include "glog/logging.h"

namespace tessera {

using tessera::v1::FabricHello;
using tessera::v1::FabricReply;
using tessera::v1::FabricRequest;

struct UcxChunkTransport::Wire final : ChunkCallWire {
  std::string address;             // the server's UCX worker address (base64, as the view carries it)
  std::string server;              // "server N at HOST:PORT", for messages
  std::string grpc_address;        // the server's HOST:PORT, probed while calls wait (common/fabric/port_probe.h)
  absl::Time started;
  std::atomic<uint64_t> id{0};     // 0 until started
  std::function<void()> done;
  absl::Time deadline;
  Endpoint* endpoint = nullptr;
  void* send_request = nullptr;    // UCX requests in flight for the call
  void* recv_request = nullptr;
  bool decided = false;            // call->status is final
  absl::Time failed_at = absl::InfiniteFuture();  // when Fail decided it
  std::atomic<bool> cancelled{false};  // Cancel came, maybe before the call started
  WireEncoding encoding;           // of the reply's values
  std::string row_data;            // a row call's ids and gradients, as sent
};

namespace {
constexpr absl::Duration kDeadlineCheck = absl::Milliseconds(20);
// Once a call to a server has waited this long, the server's gRPC port is probed this often until it answers.
constexpr absl::Duration kProbeEvery = absl::Milliseconds(300);
// A call that failed while UCX still sends or receives for it waits this long for its peer before the
// connection is dropped (a frozen server, say).
constexpr absl::Duration kReleaseWait = absl::Seconds(5);
}  // namespace

void UcxChunkTransport::Decode(ChunkCall* call) {
  const WireEncoding& encoding = static_cast<Wire&>(*call->wire).encoding;
  call->status = DecodeInPlace(call->dst, static_cast<size_t>(call->bytes), encoding, call->What());
}

absl::StatusOr<std::unique_ptr<UcxChunkTransport>> UcxChunkTransport::Start(std::shared_ptr<const Security> security,
                                                                            CallerIdentity who,
                                                                            FabricOptions options) {
  std::unique_ptr<UcxChunkTransport> t(new UcxChunkTransport(std::move(security), std::move(who)));
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker =
      UcxWorker::Start(absl::StrCat("worker ", t->who_.worker_id), options);
  if (!worker.ok()) return worker.status();
  t->worker_ = *std::move(worker);
  UcxChunkTransport* self = t.get();
  absl::Status handler;
  t->worker_->Run([&] {
    handler = self->worker_->SetHandler(
        kFabricReply,
        [](void* arg, const void* header, size_t header_length, void* data, size_t length,
           const ucp_am_recv_param_t* param) {
          return static_cast<UcxChunkTransport*>(arg)->OnReply(header, header_length, data, length, param);
        },
        self);
  });
  if (!handler.ok()) return handler;
  t->worker_->SetTick(kDeadlineCheck, [self] { self->CheckDeadlines(); });
  t->worker_->SetOnStop([self] {
    std::vector<Endpoint*> all;
    for (auto& [address, e] : self->endpoints_) all.push_back(e.get());
    for (Endpoint* e : all) self->Drop(e, absl::CancelledError("the client is closing"));
  });
  return t;
}

UcxChunkTransport::~UcxChunkTransport() {
  if (worker_) worker_->Stop();
}

absl::Status UcxChunkTransport::Prepare(ChunkCall& call, const CallerIdentity&) {
  absl::StatusOr<const tessera::v1::ServerInfo*> server = call.map->Server(call.server_id);
  if (!server.ok()) return absl::UnavailableError(server.status().message());
  if ((*server)->fabric_address().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server ", call.server_id, " at ", call.server,
        " has no UCX (started with --fabric=false, or it could not start UCX); this job's transport is UCX"));
  }
  auto wire = std::make_unique<Wire>();
  wire->address = (*server)->fabric_address();
  wire->server = absl::StrCat("server ", call.server_id, " at ", call.server);
  wire->grpc_address = call.server;
  call.wire = std::move(wire);
  return absl::OkStatus();
}

void UcxChunkTransport::Start(ChunkCall* call, std::function<void()> done) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  wire.done = std::move(done);
  wire.started = absl::Now();
  wire.deadline = wire.started + call->timeout;
  wire.id = next_id_++;
  worker_->Post([this, call] { StartOnThread(call); });
}

void UcxChunkTransport::Cancel(ChunkCall* call) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  // Either StartOnThread sees the flag, or this sees the id and the cancel is posted after StartOnThread (posted
  // work runs in order): a cancel racing with Start is never lost.
  wire.cancelled = true;
  const uint64_t id = wire.id.load();
  if (id != 0) CancelOnThread(id);
}

void UcxChunkTransport::CancelOnThread(uint64_t id) {
  worker_->Post([this, id] {
    if (ChunkCall* c = Find(id)) Fail(c, absl::CancelledError(c->What() + ": cancelled"));
  });
}

void UcxChunkTransport::OnView(const ShardMapIndex& map) {
  std::set<std::string> live;
  for (const tessera::v1::ServerInfo& s : map.map().servers()) live.insert(s.fabric_address());
  const uint64_t epoch = map.epoch();
  worker_->Post([this, live = std::move(live), epoch] {
    std::vector<Endpoint*> gone;
    for (auto& [address, e] : endpoints_) {
      if (live.count(address) == 0) gone.push_back(e.get());
    }
    for (Endpoint* e : gone) {
      Drop(e, absl::UnavailableError(absl::StrCat(e->server, " left the cluster view (epoch ", epoch, ")")));
    }
  });
}

ChunkCall* UcxChunkTransport::Find(uint64_t id) {
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

void UcxChunkTransport::StartOnThread(ChunkCall* call) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  calls_[wire.id] = call;
  if (wire.cancelled.load()) {
    Fail(call, absl::CancelledError(call->What() + ": cancelled"));
    return;
  }
  absl::StatusOr<Endpoint*> endpoint = EndpointFor(wire.address, wire.server, wire.grpc_address);
  if (!endpoint.ok()) {
    Fail(call, absl::Status(endpoint.status().code(), absl::StrCat(call->What(), ": ", endpoint.status().message())));
    return;
  }
  wire.endpoint = *endpoint;
  if ((*endpoint)->ready) {
    SendRequest(call);
  } else {
    (*endpoint)->waiting.push_back(wire.id);
  }
}

absl::StatusOr<UcxChunkTransport::Endpoint*> UcxChunkTransport::EndpointFor(const std::string& address,
                                                                            const std::string& server,
                                                                            const std::string& grpc_address) {
  if (auto it = endpoints_.find(address); it != endpoints_.end()) return it->second.get();
  absl::StatusOr<std::string> remote = DecodeFabricAddress(address);
  if (!remote.ok()) return absl::FailedPreconditionError(absl::StrCat(server, ": ", remote.status().message()));
  auto endpoint = std::make_unique<Endpoint>();
  endpoint->address = address;
  endpoint->server = server;
  // Without a probe a dead server's calls end at their deadlines only.
  if (absl::StatusOr<SocketAddress> probed = ResolveHostPort(grpc_address); probed.ok()) {
    endpoint->probe = std::make_unique<PortProbe>(*probed);
  } else {
    LOG(WARNING) << "UCX: cannot watch " << server << ": " << probed.status();
  }
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(remote->data());
  // No peer-failure mode: with it UCX 1.13 keeps to transports that watch their peer (TCP), never shared memory.
  // A lost server shows in the view instead (OnView), and a call whose server went silent ends at its deadline.
  params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.arg = this;
  params.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<UcxChunkTransport*>(arg);
    for (auto& [address, e] : self->endpoints_) {
      if (e->ep == ep) {
        self->Drop(e.get(), FromUcsStatus(status, absl::StrCat("the UCX connection to ", e->server, " failed")));
        return;
      }
    }
  };
  ucs_status_t status = ucp_ep_create(worker_->worker(), &params, &endpoint->ep);
  if (status == UCS_ERR_UNREACHABLE) {
    // No transport in common: typically a server on another host with UCX's TCP off on one side.
    return absl::FailedPreconditionError(absl::StrCat(
        "UCX connection to ", server, ": no transport reaches it from here (", ucs_status_string(status),
        "); between hosts without RDMA, UCX needs TCP, which both the server and the worker must be given with "
        "--fabric_tcp (on a fabric no untrusted process reaches), or use transport: GRPC"));
  }
  if (status != UCS_OK) {
    // Typically a server that died (UCX 1.13 says ENDPOINT_TIMEOUT for a dead peer's shared memory): retried
    // after the view has moved its chunks.
    return absl::UnavailableError(
        absl::StrCat("UCX connection to ", server, ": ", ucs_status_string(status)));
  }
  Endpoint* e = endpoint.get();
  endpoints_[address] = std::move(endpoint);

  FabricHello hello;
  const uint64_t hello_id = next_id_++;
  hello.set_request_id(hello_id);
  hello.set_authorization(security_->authorization());
  hello.set_worker_id(who_.worker_id);
  hello.set_member_key(who_.member_key);
  hellos_[hello_id] = e;
  SendActiveMessage(*worker_, e->ep, kFabricHello, hello.SerializeAsString(), nullptr, 0, nullptr,
                    [this, hello_id](const absl::Status& sent) {
                      if (sent.ok()) return;
                      auto it = hellos_.find(hello_id);
                      if (it != hellos_.end()) Drop(it->second, sent);
                    });
  return e;
}

void UcxChunkTransport::SendRequest(ChunkCall* call) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  const uint64_t id = wire.id;
  FabricRequest request;
  request.set_request_id(id);
  const void* data = nullptr;
  size_t length = 0;
  if (call->op == kPull) {
    request.set_op(FabricRequest::PULL);
    *request.mutable_pull() = call->pull();
  } else if (call->op == kRowPull || call->op == kRowPush) {
    // The ids (and a push's gradients) travel as the message's data: a header holds a few KiB at most.
    const auto& ids = call->op == kRowPull ? call->row_pull().ids() : call->row_push().ids();
    const size_t id_bytes = ids.size() * sizeof(uint64_t);
    wire.row_data.resize(id_bytes + (call->op == kRowPush ? call->src.size() : 0));
    if (id_bytes > 0) std::memcpy(wire.row_data.data(), ids.data(), id_bytes);
    request.set_row_ids(ids.size());
    if (call->op == kRowPull) {
      request.set_op(FabricRequest::ROW_PULL);
      *request.mutable_row_pull() = call->row_pull();
      request.mutable_row_pull()->clear_ids();
    } else {
      request.set_op(FabricRequest::ROW_PUSH);
      *request.mutable_row_push() = call->row_push();
      request.mutable_row_push()->clear_ids();
      if (!call->src.empty()) std::memcpy(wire.row_data.data() + id_bytes, call->src.data(), call->src.size());
    }
    data = wire.row_data.data();
    length = wire.row_data.size();
  } else {
    request.set_op(call->op == kExchange || call->op == kNorm ? FabricRequest::PUSH_PULL : FabricRequest::PUSH);
    *request.mutable_push() = call->push();
    data = call->src.data();
    length = call->src.size();
  }
  // A send that completes (or fails) at once runs its callback before returning null; the call may be gone then.
  void* pending = SendActiveMessage(*worker_, wire.endpoint->ep, kFabricRequest, request.SerializeAsString(), data, length,
                                    nullptr, [this, id](const absl::Status& sent) {
                                      ChunkCall* c = Find(id);
                                      if (c == nullptr) return;
                                      static_cast<Wire&>(*c->wire).send_request = nullptr;
                                      if (!sent.ok()) {
                                        Fail(c, absl::Status(sent.code(), absl::StrCat(c->What(), ": ", sent.message())));
                                      } else {
                                        MaybeFinish(c);
                                      }
                                    });
  if (pending != nullptr) wire.send_request = pending;
}

void UcxChunkTransport::Fail(ChunkCall* call, const absl::Status& status) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  if (!wire.decided) {
    call->status = status;
    wire.decided = true;
    wire.failed_at = absl::Now();
  }
  // What UCX still does for the call is not cancelled (UCX 1.13 does not cancel an active message's rendezvous
  // in progress): it completes as the peer answers, and a peer that never does is dropped (CheckDeadlines),
  // which completes it.
  MaybeFinish(call);
}

void UcxChunkTransport::MaybeFinish(ChunkCall* call) {
  Wire& wire = static_cast<Wire&>(*call->wire);
  if (!wire.decided || wire.send_request != nullptr || wire.recv_request != nullptr) return;
  calls_.erase(wire.id);
  std::function<void()> done = std::move(wire.done);
  done();  // the call may be gone after this
}

void UcxChunkTransport::Drop(Endpoint* endpoint, const absl::Status& why) {
  std::vector<uint64_t> affected;
  for (auto& [id, c] : calls_) {
    if (static_cast<Wire&>(*c->wire).endpoint == endpoint) affected.push_back(id);
  }
  for (auto it = hellos_.begin(); it != hellos_.end();) {
    it = it->second == endpoint ? hellos_.erase(it) : std::next(it);
  }
  const std::string address = endpoint->address;
  ucp_ep_h ep = endpoint->ep;
  if (why.code() != absl::StatusCode::kCancelled) {
    LOG(WARNING) << "UCX connection to " << endpoint->server << " closed, " << affected.size()
                 << " calls on it failed: " << why;
  }
  endpoints_.erase(address);  // the next call connects again
  const absl::Status unavailable =
      why.code() == absl::StatusCode::kCancelled || why.code() == absl::StatusCode::kUnauthenticated ||
              why.code() == absl::StatusCode::kPermissionDenied
          ? why
          : absl::UnavailableError(why.message());
  for (uint64_t id : affected) {
    ChunkCall* c = Find(id);
    if (c == nullptr) continue;
    Wire& wire = static_cast<Wire&>(*c->wire);
    wire.endpoint = nullptr;
    // The call ends now; what UCX still holds for it ends when the endpoint is closed. (Its peer failed or left
    // the view, so no more of its bytes arrive.)
    wire.send_request = nullptr;
    wire.recv_request = nullptr;
    Fail(c, absl::Status(unavailable.code(), absl::StrCat(c->What(), ": ", unavailable.message())));
  }
  worker_->CloseLater(ep);
}

void UcxChunkTransport::CheckDeadlines() {
  const absl::Time now = absl::Now();
  std::vector<uint64_t> late;
  std::set<Endpoint*> waited_on;  // endpoints with a call waiting longer than kProbeEvery
  std::set<Endpoint*> stuck;      // endpoints with a failed call UCX has not released for kReleaseWait
  for (auto& [id, c] : calls_) {
    const Wire& wire = static_cast<Wire&>(*c->wire);
    if (wire.deadline < now && !wire.decided) late.push_back(id);
    if (wire.endpoint != nullptr && now - wire.started > kProbeEvery) waited_on.insert(wire.endpoint);
    if (wire.endpoint != nullptr && now - wire.failed_at > kReleaseWait) stuck.insert(wire.endpoint);
  }
  for (Endpoint* e : stuck) {
    waited_on.erase(e);
    Drop(e, absl::UnavailableError(absl::StrCat(e->server, " did not finish a failed call's transfer within ",
                                                absl::FormatDuration(kReleaseWait))));
  }
  for (Endpoint* e : waited_on) {
    if (e->probe == nullptr) continue;
    std::optional<absl::Status> verdict = e->probe->Poll(now, kProbeEvery);
    if (verdict && !verdict->ok()) {
      Drop(e, absl::UnavailableError(absl::StrCat(e->server, " is gone: its gRPC port says ", verdict->message())));
    }
  }
  for (uint64_t id : late) {
    ChunkCall* c = Find(id);
    if (c == nullptr) continue;
    Fail(c, absl::DeadlineExceededError(absl::StrCat(c->What(), ": no answer within ",
                                                     absl::FormatDuration(c->timeout))));
  }
}

ucs_status_t UcxChunkTransport::OnReply(const void* header, size_t header_length, void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  // Values not taken (a reply no call waits for any more, or one that does not parse) are dropped by returning
  // UCS_OK, which completes the sender's send. Releasing them too (ucp_am_data_release, which is for data a
  // handler kept with UCS_INPROGRESS) answers the sender twice, and UCX 1.13 aborts there on the second answer
  // (ucp_rndv_ats_handler's assertion: the servers' crash at a job's end).
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  FabricReply reply;
  if (!reply.ParseFromArray(header, static_cast<int>(header_length))) {
    LOG(WARNING) << "UCX: a reply that does not parse (" << header_length << " header bytes); dropped";
    return UCS_OK;
  }
  if (auto hello = hellos_.find(reply.request_id()); hello != hellos_.end()) {
    Endpoint* e = hello->second;
    hellos_.erase(hello);
    absl::Status accepted = StatusOfReply(reply, absl::StrCat(e->server, " refused this worker"));
    if (!accepted.ok()) {
      Drop(e, accepted);
      return UCS_OK;
    }
    e->ready = true;
    std::vector<uint64_t> waiting;
    waiting.swap(e->waiting);
    for (uint64_t id : waiting) {
      if (ChunkCall* c = Find(id)) SendRequest(c);
    }
    return UCS_OK;
  }
  ChunkCall* call = Find(reply.request_id());
  if (call == nullptr || static_cast<Wire&>(*call->wire).decided) {  // given up on already
    return UCS_OK;
  }
  Wire& wire = static_cast<Wire&>(*call->wire);
  absl::Status status = StatusOfReply(reply, call->What());
  if (!status.ok()) {
    Fail(call, status);
    return UCS_OK;
  }
  call->version = reply.version();
  call->clock_version = reply.clock_version();
  call->skipped = reply.skipped();
  call->round_sq_norm = reply.round_sq_norm();
  if (call->op == kRowPush) {
    call->rows_pushed.set_rows_updated(reply.rows_updated());
    call->rows_pushed.set_rows_refused(reply.rows_refused());
    call->rows_pushed.set_duplicate(reply.duplicate());
    call->rows_pushed.set_late(reply.late());
  }
  if (call->op == kPush || call->op == kAssign || call->op == kNorm || call->op == kRowPush || length == 0) {
    // No values: a push, a norm round's answer, or unchanged values.
    wire.decided = true;
    MaybeFinish(call);
    return UCS_OK;
  }
  WireEncoding encoding;
  encoding.precision = reply.data_precision();
  if (length != call->dst.size() * BytesPerValue(encoding.precision)) {
    Fail(call, absl::InternalError(absl::StrCat(call->What(), ": the reply carries ", length, " bytes for ",
                                                call->dst.size(), " ", PrecisionName(encoding.precision),
                                                " values")));
    return UCS_OK;
  }
  call->bytes = static_cast<int64_t>(length);
  wire.encoding = encoding;
  if (!rendezvous) {
    std::memcpy(call->dst.data(), data, length);
    wire.decided = true;
    Decode(call);
    MaybeFinish(call);
    return UCS_OK;
  }
  const uint64_t id = wire.id;
  // As for a send: a receive done at once has run its callback, and the call may be gone.
  void* pending = ReceiveActiveMessageData(*worker_, data, call->dst.data(), length,
                                           [this, id](const absl::Status& received) {
                                             ChunkCall* c = Find(id);
                                             if (c == nullptr) return;
                                             Wire& w = static_cast<Wire&>(*c->wire);
                                             w.recv_request = nullptr;
                                             if (!w.decided) {
                                               c->status = received.ok() ? received
                                                                         : absl::Status(received.code(), absl::StrCat(
                                                                               c->What(), ": ", received.message()));
                                               w.decided = true;
                                               if (received.ok()) Decode(c);
                                             }
                                             MaybeFinish(c);
                                           });
  if (pending != nullptr) wire.recv_request = pending;
  return UCS_OK;
}

}  // namespace tessera

#include "server/fabric_service.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fabric/active_messages.h"
#include "common/model/float_payload.h"
#include "common/rpc/rpc.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"
#include "server/request_conversions.h"

namespace tessera {

using tessera::v1::FabricHello;
using tessera::v1::FabricReply;
using tessera::v1::FabricRequest;

namespace {

FabricReply ReplyWithValues(uint64_t request_id, const ChunkValues& values) {
  FabricReply reply;
  reply.set_request_id(request_id);
  reply.set_version(values.version);
  reply.set_clock_version(values.clock_version);
  reply.set_skipped(values.skipped);
  reply.set_round_sq_norm(values.round_sq_norm);
  reply.set_data_precision(values.precision);
  return reply;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FabricService>> FabricService::Start(ShardStore* store, ThreadPool* updates,
                                                                    size_t inline_update_bytes,
                                                                    std::shared_ptr<const Security> security,
                                                                    FabricOptions options) {
  std::unique_ptr<FabricService> s(new FabricService(store, updates, inline_update_bytes, std::move(security)));
  absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Start("the server's fabric", options);
  if (!worker.ok()) return worker.status();
  s->worker_ = *std::move(worker);
  if (s->worker_->address().empty()) return absl::UnavailableError("UCX gave the server's fabric no address");
  FabricService* self = s.get();
  absl::Status started;
  s->worker_->Run([&] {
    started = self->worker_->SetHandler(
        kFabricHello,
        [](void* arg, const void* header, size_t header_length, void* data, size_t,
           const ucp_am_recv_param_t* param) {
          return static_cast<FabricService*>(arg)->OnHello(header, header_length, data, param);
        },
        self);
    if (started.ok()) {
      started = self->worker_->SetHandler(
          kFabricRequest,
          [](void* arg, const void* header, size_t header_length, void* data, size_t length,
             const ucp_am_recv_param_t* param) {
            return static_cast<FabricService*>(arg)->OnRequest(header, header_length, data, length, param);
          },
          self);
    }
  });
  if (!started.ok()) return started;
  s->worker_->SetDrained([self] {
    self->stopping_ = true;
    return self->sends_in_flight_ == 0;
  });
  s->worker_->SetOnStop([self] {
    std::vector<ucp_ep_h> open;
    for (auto& [ep, c] : self->connections_) open.push_back(ep);
    for (ucp_ep_h ep : open) self->Close(ep);
  });
  return s;
}

FabricService::~FabricService() {
  if (worker_) worker_->Stop();
}

std::string FabricService::address() const { return EncodeFabricAddress(worker_->address()); }

void FabricService::Close(ucp_ep_h ep) {
  if (connections_.erase(ep) == 0) return;  // no reply goes there from now on
  worker_->CloseLater(ep);
}

ucs_status_t FabricService::OnHello(const void* header, size_t header_length, void* data,
                                    const ucp_am_recv_param_t* param) {
  FabricHello hello;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 ||
      !hello.ParseFromArray(header, static_cast<int>(header_length))) {
    LOG_EVERY_N(WARNING, 100) << "UCX: a hello that does not parse, or that names no connection; dropped";
    return UCS_OK;
  }
  ucp_ep_h ep = param->reply_ep;
  absl::Status accepted = security_->AuthenticateHeader(hello.authorization());
  const tessera::v1::JobSpec job = store_->job();
  if (accepted.ok() && job.transport() != tessera::v1::UCX) {
    accepted = absl::FailedPreconditionError(absl::StrCat("job '", job.name(), "' does not use transport UCX"));
  }
  if (accepted.ok()) accepted = store_->CheckMemberKey(hello.worker_id(), hello.member_key());
  if (accepted.ok() && connections_.count(ep) == 0 && connections_.size() >= kMaxConnections) {
    accepted = absl::ResourceExhaustedError(absl::StrCat("this server holds ", kMaxConnections, " UCX connections"));
  }
  // A connection exists only once a hello was accepted on it; a refused one leaves nothing behind (the peer's
  // next request on it is refused too).
  if (accepted.ok()) {
    Connection& c = connections_[ep];
    c.ep = ep;
    c.worker_id = hello.worker_id();
    c.member_key = hello.member_key();
  } else {
    connections_.erase(ep);
    LOG_EVERY_N(WARNING, 100) << "UCX: refused a connection of worker " << hello.worker_id() << ": " << accepted;
  }
  SendReply(ep, ReplyWithStatus(hello.request_id(), accepted));
  return UCS_OK;
}

ucs_status_t FabricService::OnRequest(const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  // Values not taken (a refused request) are dropped by returning UCS_OK, which completes the sender's send;
  // never ucp_am_data_release as well (see ucx_chunk_transport.cc's OnReply: UCX 1.13 aborts the sender).
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  auto request = std::make_shared<FabricRequest>();
  if (!request->ParseFromArray(header, static_cast<int>(header_length))) {
    LOG(WARNING) << "UCX: a request that does not parse (" << header_length << " header bytes); dropped";
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) {
    return UCS_OK;  // nowhere to answer
  }
  ucp_ep_h ep = param->reply_ep;
  auto connection = connections_.find(ep);
  if (connection == connections_.end()) {
    SendReply(ep, ReplyWithStatus(request->request_id(),
                                  absl::UnauthenticatedError("this connection was not accepted: its first message must "
                                                             "be a hello with the job token and the worker's member key")));
    return UCS_OK;
  }
  if (stopping_) {  // no new reply with values goes out while the sends in flight drain
    SendReply(ep, ReplyWithStatus(request->request_id(), absl::UnavailableError("the server is stopping")));
    return UCS_OK;
  }
  if (request->op() == FabricRequest::PULL) {
    const tessera::v1::PullRequest& r = request->pull();
    absl::StatusOr<ChunkValues> values = store_->Pull(ToChunkPull(r));
    if (!values.ok()) {
      Reply(ep, ReplyWithStatus(request->request_id(), values.status()));
    } else {
      Reply(ep, ReplyWithValues(request->request_id(), *values), values->bytes, values->length);
    }
    return UCS_OK;
  }
  const bool rows = request->op() == FabricRequest::ROW_PULL || request->op() == FabricRequest::ROW_PUSH;
  if (rows) {
    ++row_requests_;
    if (request->row_ids() < 0 || request->row_ids() > kMaxRowsPerRequest ||
        length < static_cast<size_t>(request->row_ids()) * sizeof(uint64_t) ||
        length > static_cast<size_t>(kMaxMessageBytes)) {
      Reply(ep, ReplyWithStatus(request->request_id(),
                                absl::InvalidArgumentError(absl::StrCat(
                                    "a request for ", request->row_ids(), " rows with ", length,
                                    " bytes of ids and gradients: at most ", kMaxRowsPerRequest, " rows and ",
                                    kMaxMessageBytes, " bytes"))));
      return UCS_OK;
    }
  }
  const WireEncoding encoding = rows ? WireEncoding() : EncodingOf(request->push());
  const size_t width = BytesPerValue(encoding.precision);
  if (!rows && ((!encoding.sparse && length % width != 0) || length > static_cast<size_t>(kMaxMessageBytes))) {
    Reply(ep, ReplyWithStatus(request->request_id(),
                              absl::InvalidArgumentError(absl::StrCat(
                                  "a push of ", length, " bytes: expected ", PrecisionName(encoding.precision),
                                  " values, at most ", kMaxMessageBytes, " bytes"))));
    return UCS_OK;
  }
  // Room for the values decoded (dense ones are decoded where they arrived: no second copy).
  const size_t decoded = encoding.sparse || rows ? length : DecodedBytes(request->push(), length);
  std::shared_ptr<PooledBuffer> values = buffers_.Get(std::max<size_t>(decoded, 1));
  if (!rendezvous) {
    if (length > 0) std::memcpy(values->data(), data, length);
    Apply(ep, std::move(request), std::move(values), length);
    return UCS_OK;
  }
  ReceiveActiveMessageData(*worker_, data, values->data(), length,
                           [this, ep, request, values, length](const absl::Status& received) {
                             if (!received.ok()) {
                               LOG(WARNING) << "UCX: a push's values did not arrive: " << received;
                               return;  // the connection failed: its caller retries elsewhere
                             }
                             Apply(ep, request, values, length);
                           });
  return UCS_OK;
}

namespace {

// The ids at the front of a row request's data.
void TakeRowIds(const FabricRequest& request, const PooledBuffer& data, google::protobuf::RepeatedField<uint64_t>* ids) {
  ids->Resize(static_cast<int>(request.row_ids()), 0);
  if (request.row_ids() > 0) std::memcpy(ids->mutable_data(), data.data(), request.row_ids() * sizeof(uint64_t));
}

}  // namespace

void FabricService::PullRowsOf(ucp_ep_h ep, const FabricRequest& request, const PooledBuffer& data) {
  auto pull = std::make_shared<tessera::v1::RowPullRequest>(request.row_pull());
  TakeRowIds(request, data, pull->mutable_ids());
  // Answered now, or once the round of rows it waits for is applied; the values leave from the store's buffer.
  store_->PullRows(std::move(pull), [this, ep, id = request.request_id()](absl::StatusOr<PulledRows> rows) {
    if (!rows.ok()) {
      Reply(ep, ReplyWithStatus(id, rows.status()));
      return;
    }
    FabricReply reply;
    reply.set_request_id(id);
    Reply(ep, std::move(reply), std::move(rows->values), rows->bytes);
  });
}

void FabricService::PushRowsOf(ucp_ep_h ep, const Connection& c, std::shared_ptr<const FabricRequest> request,
                               std::shared_ptr<PooledBuffer> data, size_t length) {
  const uint64_t id = request->request_id();
  if (request->row_push().worker_id() != c.worker_id) {
    Reply(ep, ReplyWithStatus(id, absl::PermissionDeniedError(
                                      absl::StrCat("a push of rows as worker ", request->row_push().worker_id(),
                                                   " on the connection of worker ", c.worker_id))));
    return;
  }
  auto apply = [this, ep, id, request, data, length, key = c.member_key] {
    tessera::v1::RowPushRequest push = request->row_push();
    TakeRowIds(*request, *data, push.mutable_ids());
    const size_t id_bytes = request->row_ids() * sizeof(uint64_t);
    push.set_grads(std::string(reinterpret_cast<const char*>(data->data()) + id_bytes, length - id_bytes));
    store_->PushRows(push, key, [this, ep, id](absl::StatusOr<tessera::v1::RowPushResponse> pushed) {
      if (!pushed.ok()) {
        Reply(ep, ReplyWithStatus(id, pushed.status()));
        return;
      }
      FabricReply reply;
      reply.set_request_id(id);
      reply.set_rows_updated(pushed->rows_updated());
      reply.set_rows_refused(pushed->rows_refused());
      reply.set_duplicate(pushed->duplicate());
      reply.set_late(pushed->late());
      Reply(ep, std::move(reply));
    });
  };
  if (length >= inline_update_bytes_) {
    updates_->Submit(std::move(apply));
  } else {
    apply();
  }
}

void FabricService::Apply(ucp_ep_h ep, std::shared_ptr<const FabricRequest> request,
                          std::shared_ptr<PooledBuffer> values, size_t length) {
  auto connection = connections_.find(ep);
  if (connection == connections_.end()) return;  // closed while the values arrived: the caller retries
  const Connection& c = connection->second;
  if (request->op() == FabricRequest::ROW_PULL) {
    PullRowsOf(ep, *request, *values);
    return;
  }
  if (request->op() == FabricRequest::ROW_PUSH) {
    PushRowsOf(ep, c, std::move(request), std::move(values), length);
    return;
  }
  absl::StatusOr<ChunkPush> push = ToChunkPush(request->push(), c.member_key);
  if (push.ok() && push->worker_id != c.worker_id) {
    push = absl::PermissionDeniedError(absl::StrCat("a push as worker ", push->worker_id,
                                                    " on the connection of worker ", c.worker_id));
  }
  if (!push.ok()) {
    Reply(ep, ReplyWithStatus(request->request_id(), push.status()));
    return;
  }
  const uint64_t id = request->request_id();
  auto apply = [this, ep, id, request, values, length, push = *std::move(push)] {
    SpanPayload payload(values->data(), length, values->capacity());
    payload.set_encoding(EncodingOf(request->push()));
    if (request->op() == FabricRequest::PUSH) {
      store_->Push(push, payload, [this, ep, id](absl::StatusOr<PushOutcome> outcome) {
        if (!outcome.ok()) {
          Reply(ep, ReplyWithStatus(id, outcome.status()));
          return;
        }
        FabricReply reply;
        reply.set_request_id(id);
        reply.set_version(outcome->version);
        reply.set_duplicate(outcome->duplicate);
        reply.set_late(outcome->late);
        Reply(ep, std::move(reply));
      });
      return;
    }
    auto waiter = std::make_shared<ExchangeWaiter>([this, ep, id](absl::StatusOr<ChunkValues> after) {
      if (!after.ok()) {
        Reply(ep, ReplyWithStatus(id, after.status()));
      } else {
        Reply(ep, ReplyWithValues(id, *after), after->bytes, after->length);
      }
    });
    store_->PushPull(push, payload, waiter);
  };
  RunUpdate(updates_, inline_update_bytes_, request->push(), length, std::move(apply));
}

void FabricService::SendReply(ucp_ep_h ep, const FabricReply& reply) {
  Send(ep, reply, nullptr, 0);
}

void FabricService::Send(ucp_ep_h ep, const FabricReply& reply, std::shared_ptr<const PooledBuffer> values,
                         size_t length) {
  const void* data = values != nullptr ? values->data() : nullptr;
  ++sends_in_flight_;
  SendActiveMessage(*worker_, ep, kFabricReply, reply.SerializeAsString(), data, data == nullptr ? 0 : length,
                    std::move(values), [this](const absl::Status&) { --sends_in_flight_; });
}

void FabricService::Reply(ucp_ep_h ep, FabricReply reply, std::shared_ptr<const PooledBuffer> values,
                          size_t length) {
  auto send = [this, ep, reply = std::move(reply), values = std::move(values), length]() mutable {
    if (connections_.find(ep) == connections_.end()) return;  // closed meanwhile: the caller retries
    Send(ep, reply, std::move(values), length);
  };
  if (worker_->OnProgressThread()) {
    send();
  } else {
    worker_->Post(std::move(send));
  }
}

}  // namespace tessera

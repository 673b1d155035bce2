#include "worker/client/grpc_chunk_transport.h"

#include <atomic>

#include "absl/strings/str_cat.h"

#include "common/rpc/grpc_status.h"
#include "common/base/status_macros.h"
#include "common/rpc/wire_payload.h"

namespace tessera {

using tessera::v1::PullResponse;
using tessera::v1::PushRequest;
using tessera::v1::PushResponse;

namespace {

struct GrpcWire final : ChunkCallWire {
  grpc::GenericStub* stub = nullptr;  // one of the server's connections
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::atomic<bool> cancelled{false};  // Cancel() was called: a CANCELLED status is ours
};

GrpcWire& WireOf(ChunkCall& call) { return static_cast<GrpcWire&>(*call.wire); }

const char* MethodName(ChunkOp op) {
  switch (op) {
    case kPull:
      return "/tessera.v1.ParameterServer/Pull";
    case kExchange:
    case kNorm:
      return "/tessera.v1.ParameterServer/PushPull";
    default:
      return "/tessera.v1.ParameterServer/Push";
  }
}

absl::Status Decode(ChunkCall& c) {
  GrpcWire& wire = WireOf(c);
  if (c.op == kPush || c.op == kAssign) {
    PushResponse reply;
    ReceivedPayload none;
    TESSERA_RETURN_IF_ERROR(ParseWithPayload(wire.response, /*field_number=*/0, &reply, &none));
    c.version = reply.version();
    return absl::OkStatus();
  }
  PullResponse header;
  ReceivedPayload payload;
  TESSERA_RETURN_IF_ERROR(ParseWithPayload(wire.response, PullResponse::kDataFieldNumber, &header, &payload));
  c.version = header.version();
  c.clock_version = header.clock_version();
  c.skipped = header.skipped();
  c.round_sq_norm = header.round_sq_norm();
  if (payload.empty()) return absl::OkStatus();  // unchanged since the version the pull named
  WireEncoding encoding;
  encoding.precision = header.data_precision();
  payload.set_encoding(encoding);
  // Servers check every value that enters a chunk, so values that leave one need no second check here.
  TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(c.dst, /*check_finite=*/false, c.What()));
  c.bytes = static_cast<int64_t>(payload.size());
  return absl::OkStatus();
}

}  // namespace

GrpcChunkTransport::GrpcChunkTransport(std::shared_ptr<const Security> security, int connections_per_server)
    : security_(security),
      connections_per_server_(connections_per_server),
      stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
        return std::make_unique<grpc::GenericStub>(channel);
      }) {}

absl::Status GrpcChunkTransport::Prepare(ChunkCall& call, const CallerIdentity& who) {
  auto wire = std::make_unique<GrpcWire>();
  wire->stub = stubs_.Get(call.server, call.placement->index() % connections_per_server_);
  SetTimeout(wire->context, call.timeout);
  wire->context.set_wait_for_ready(false);
  security_->Authorize(wire->context);
  wire->context.AddMetadata(kMemberKeyHeader, who.member_key);
  if (call.op == kPull) {
    grpc::Slice slice(call.pull().SerializeAsString());
    wire->request = grpc::ByteBuffer(&slice, 1);
  } else {
    wire->request = SerializeWithPayload(call.push(), PushRequest::kDataFieldNumber, BorrowedBytesSlice(call.src));
  }
  call.wire = std::move(wire);
  return absl::OkStatus();
}

void GrpcChunkTransport::Start(ChunkCall* c, std::function<void()> done) {
  GrpcWire& wire = WireOf(*c);
  wire.stub->UnaryCall(&wire.context, MethodName(c->op), grpc::StubOptions(), &wire.request, &wire.response,
                       [c, done = std::move(done)](grpc::Status status) {
                         c->status = FromGrpcCallStatus(status, WireOf(*c).context, c->What(),
                                                        WireOf(*c).cancelled);
                         if (c->status.ok()) c->status = Decode(*c);
                         done();
                       });
}

void GrpcChunkTransport::Cancel(ChunkCall* call) {
  WireOf(*call).cancelled = true;
  WireOf(*call).context.TryCancel();
}

}  // namespace tessera

#include "server/server_service.h"

#include <memory>

#include "common/checkpoint_file.h"
#include "common/grpc_status.h"
#include "common/wire_payload.h"

namespace tessera {
namespace {

using tessera::v1::PullRequest;
using tessera::v1::PullResponse;
using tessera::v1::PushRequest;
using tessera::v1::PushResponse;

constexpr int kPushDataField = PushRequest::kDataFieldNumber;
constexpr int kPullDataField = PullResponse::kDataFieldNumber;

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, context));
  return reactor;
}

// The reply of a Pull or PushPull: header fields, then the values straight from their pooled buffer.
void WriteValues(const ChunkValues& values, grpc::ByteBuffer* response) {
  PullResponse header;
  header.set_version(values.version);
  header.set_clock_version(values.clock_version);
  if (values.bytes == nullptr) {
    grpc::Slice head(header.SerializeAsString());
    *response = grpc::ByteBuffer(&head, 1);
    return;
  }
  *response = SerializeWithPayload(header, kPullDataField, BufferSlice(values.bytes, values.length));
}

ChunkPush ToChunkPush(const PushRequest& r) {
  ChunkPush push;
  push.address = {r.epoch(), r.key().param(), r.key().index()};
  push.worker_id = r.worker_id();
  push.incarnation = r.incarnation();
  push.seq = r.seq();
  push.clock = r.clock();
  push.read_clock_version = r.read_clock_version();
  push.batch_size = r.batch_size();
  push.assign = r.kind() == PushRequest::ASSIGN;
  return push;
}

// A PushPull in flight. The store completes its waiter, from this call's thread or from the push that closes
// the round; a cancelled call completes it with CANCELLED instead. Whichever comes first finishes the call.
class ExchangeReactor final : public grpc::ServerUnaryReactor {
 public:
  ExchangeReactor(grpc::CallbackServerContext* context, grpc::ByteBuffer* response)
      : waiter_(std::make_shared<ExchangeWaiter>([this, context, response](absl::StatusOr<ChunkValues> values) {
          if (!values.ok()) {
            Finish(ToGrpcStatus(values.status(), context));
            return;
          }
          WriteValues(*values, response);
          Finish(grpc::Status::OK);
        })) {}

  const std::shared_ptr<ExchangeWaiter>& waiter() const { return waiter_; }

  void OnCancel() override { waiter_->Complete(absl::CancelledError("the caller cancelled the exchange")); }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<ExchangeWaiter> waiter_;
};

}  // namespace

grpc::ServerUnaryReactor* ServerService::Pull(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  PullRequest r;
  ReceivedPayload unused;
  if (absl::Status parsed = ParseWithPayload(*request, /*field_number=*/0, &r, &unused); !parsed.ok()) {
    return Finish(context, parsed);
  }
  absl::StatusOr<ChunkValues> values =
      store_->Pull(ChunkPull{{r.epoch(), r.key().param(), r.key().index()}, r.have_version()});
  if (!values.ok()) return Finish(context, values.status());
  WriteValues(*values, response);
  return Finish(context, absl::OkStatus());
}

void ServerService::RunUpdate(size_t bytes, std::function<void()> apply) {
  if (bytes < inline_update_bytes_) {
    apply();
  } else {
    updates_->Submit(std::move(apply));
  }
}

grpc::ServerUnaryReactor* ServerService::Push(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  PushRequest r;
  auto payload = std::make_shared<ReceivedPayload>();
  if (absl::Status parsed = ParseWithPayload(*request, kPushDataField, &r, payload.get()); !parsed.ok()) {
    return Finish(context, parsed);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunUpdate(payload->size(), [this, context, response, reactor, r = std::move(r), payload] {
    absl::StatusOr<PushOutcome> outcome = store_->Push(ToChunkPush(r), *payload);
    if (!outcome.ok()) {
      reactor->Finish(ToGrpcStatus(outcome.status(), context));
      return;
    }
    PushResponse reply;
    reply.set_version(outcome->version);
    reply.set_duplicate(outcome->duplicate);
    reply.set_late(outcome->late);
    grpc::Slice slice(reply.SerializeAsString());
    *response = grpc::ByteBuffer(&slice, 1);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ServerService::PushPull(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  PushRequest r;
  auto payload = std::make_shared<ReceivedPayload>();
  if (absl::Status parsed = ParseWithPayload(*request, kPushDataField, &r, payload.get()); !parsed.ok()) {
    return Finish(context, parsed);
  }
  auto* reactor = new ExchangeReactor(context, response);
  std::shared_ptr<ExchangeWaiter> waiter = reactor->waiter();
  RunUpdate(payload->size(), [this, r = std::move(r), payload, waiter] {
    store_->PushPull(ToChunkPush(r), *payload, waiter);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ServerService::AssignShards(grpc::CallbackServerContext* context,
                                                      const tessera::v1::AssignShardsRequest* request,
                                                      tessera::v1::AssignShardsResponse*) {
  if (request->restore_files().empty()) {
    return Finish(context, store_->Assign(request->shard_map(), request->job(), request->server_id()));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  files_.Submit([this, context, reactor, request] {
    std::vector<tessera::v1::ShardCheckpoint> files(request->restore_files_size());
    for (int i = 0; i < request->restore_files_size(); ++i) {
      absl::StatusOr<CheckpointHeader> read = ReadCheckpointFile(request->restore_files(i), &files[i]);
      if (!read.ok()) {
        reactor->Finish(ToGrpcStatus(read.status(), context));
        return;
      }
    }
    reactor->Finish(ToGrpcStatus(store_->Assign(request->shard_map(), request->job(), request->server_id(), &files,
                                                request->restore_all()),
                                 context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ServerService::Checkpoint(grpc::CallbackServerContext* context,
                                                    const tessera::v1::CheckpointRequest* request,
                                                    tessera::v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  files_.Submit([this, context, reactor, request, response] {
    const absl::Duration wait = absl::Milliseconds(std::min<uint64_t>(request->wait_timeout_ms(), 3600000));
    absl::StatusOr<tessera::v1::ShardCheckpoint> shard =
        store_->Snapshot(request->at_version() ? request->clock() : -1, absl::Now() + wait,
                         [context] { return context->IsCancelled(); });
    if (!shard.ok()) {
      reactor->Finish(ToGrpcStatus(shard.status(), context));
      return;
    }
    CheckpointHeader header;
    header.job = store_->job_name();
    header.epoch = store_->epoch();
    header.clock = request->clock();
    absl::Status written = WriteCheckpointFile(request->path(), header, *shard);
    if (written.ok()) {
      response->set_chunks(shard->chunks_size());
      for (const auto& c : shard->chunks()) response->set_bytes(response->bytes() + c.values().size());
    }
    reactor->Finish(ToGrpcStatus(written, context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ServerService::GetStats(grpc::CallbackServerContext* context,
                                                  const tessera::v1::ServerStatsRequest*,
                                                  tessera::v1::ServerStats* response) {
  *response = store_->Stats();
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerService::DecideRounds(grpc::CallbackServerContext* context,
                                                      const tessera::v1::DecideRoundsRequest* request,
                                                      tessera::v1::DecideRoundsResponse*) {
  store_->DecideRounds(*request);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerService::Shutdown(grpc::CallbackServerContext* context,
                                                  const tessera::v1::ShutdownRequest*,
                                                  tessera::v1::ShutdownResponse*) {
  on_shutdown_();
  return Finish(context, absl::OkStatus());
}

}  // namespace tessera

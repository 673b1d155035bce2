#include "server/server_service.h"

#include <cmath>
#include <memory>

#include "common/model/checkpoint_file.h"
#include "common/rpc/grpc_status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/rpc_handler.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "common/rpc/wire_payload.h"
#include "server/replica_auth.h"

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
  header.set_skipped(values.skipped);
  header.set_round_sq_norm(values.round_sq_norm);
  header.set_data_precision(values.precision);
  if (values.bytes == nullptr) {
    grpc::Slice head(header.SerializeAsString());
    *response = grpc::ByteBuffer(&head, 1);
    return;
  }
  *response = SerializeWithPayload(header, kPullDataField, BufferSlice(values.bytes, values.length));
}

}  // namespace

namespace {

// A push's request, authenticated and parsed, its values left in gRPC's slices.
absl::Status ParsePush(const grpc::CallbackServerContext& context, const grpc::ByteBuffer& request,
                       const Security& security, PushRequest* r, ReceivedPayload* payload) {
  TESSERA_RETURN_IF_ERROR(security.Authenticate(context));
  TESSERA_RETURN_IF_ERROR(ParseWithPayload(request, kPushDataField, r, payload));
  payload->set_encoding(EncodingOf(*r));
  return absl::OkStatus();
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
  absl::Status parsed = security_->Authenticate(*context);
  if (parsed.ok()) parsed = ParseWithPayload(*request, /*field_number=*/0, &r, &unused);
  if (!parsed.ok()) return Finish(context, parsed);
  absl::StatusOr<ChunkValues> values = store_->Pull(ToChunkPull(r));
  if (!values.ok()) return Finish(context, values.status());
  WriteValues(*values, response);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* ServerService::Push(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  // Shared with the update: the push's key points into it.
  auto r = std::make_shared<PushRequest>();
  auto payload = std::make_shared<ReceivedPayload>();
  if (absl::Status parsed = ParsePush(*context, *request, *security_, r.get(), payload.get()); !parsed.ok()) {
    return Finish(context, parsed);
  }
  absl::StatusOr<ChunkPush> push = ToChunkPush(*r, ClientMetadata(*context, kMemberKeyHeader));
  if (!push.ok()) return Finish(context, push.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunUpdate(updates_, inline_update_bytes_, *r, payload->size(), [this, context, response, reactor, r, push = *std::move(push), payload] {
    store_->Push(push, *payload, [context, response, reactor](absl::StatusOr<PushOutcome> outcome) {
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
  });
  return reactor;
}

grpc::ServerUnaryReactor* ServerService::PushPull(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  // Shared with the update: the push's key points into it.
  auto r = std::make_shared<PushRequest>();
  auto payload = std::make_shared<ReceivedPayload>();
  if (absl::Status parsed = ParsePush(*context, *request, *security_, r.get(), payload.get()); !parsed.ok()) {
    return Finish(context, parsed);
  }
  absl::StatusOr<ChunkPush> push = ToChunkPush(*r, ClientMetadata(*context, kMemberKeyHeader));
  if (!push.ok()) return Finish(context, push.status());
  auto* reactor = new ExchangeReactor(context, response);
  std::shared_ptr<ExchangeWaiter> waiter = reactor->waiter();
  RunUpdate(updates_, inline_update_bytes_, *r, payload->size(), [this, r, push = *std::move(push), payload, waiter] {
    store_->PushPull(push, *payload, waiter);
  });
  return reactor;
}

absl::Status ServerService::CheckControlKey(const grpc::CallbackServerContext& context) const {
  return CheckSecret(ClientMetadata(context, kControlKeyHeader), control_key_,
                     "a control call (only the scheduler may make one)");
}

grpc::ServerUnaryReactor* ServerService::Replicate(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::ReplicateBatch;
  using tessera::v1::ReplicateBatchResponse;
  return ServeUnary<ReplicateBatch, ReplicateBatchResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const ReplicateBatch> r, UnaryReply<ReplicateBatchResponse> reply) {
        // The primary's credential for this server (server/replica_auth.h); no member key travels between servers.
        const absl::string_view credential = ClientMetadata(*context, kReplicaCredentialHeader);
        absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> held =
            store_->TakeReplicas(*r, std::string_view(credential.data(), credential.size()));
        if (!held.ok()) {
          reply(held.status());
          return;
        }
        ReplicateBatchResponse answer;
        for (const absl::StatusOr<int64_t>& unit : *held) {
          tessera::v1::ReplicateResult& result = *answer.add_results();
          if (unit.ok()) {
            result.set_version(*unit);
          } else {
            result.set_code(static_cast<int32_t>(unit.status().code()));
            result.set_message(std::string(unit.status().message().substr(0, kMaxErrorBytes)));
          }
        }
        reply(std::move(answer));
      });
}

grpc::ServerUnaryReactor* ServerService::AssignShards(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::AssignShardsRequest;
  using tessera::v1::AssignShardsResponse;
  return ServeUnary<AssignShardsRequest, AssignShardsResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const AssignShardsRequest> r, UnaryReply<AssignShardsResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckControlKey(*context));
        if (r->restore_files_size() > kMaxRestoreFiles) {
          reply(absl::InvalidArgumentError(absl::StrCat(r->restore_files_size(), " restore files; at most ",
                                                        kMaxRestoreFiles, " allowed")));
          return;
        }
        for (const std::string& path : r->restore_files()) {
          TESSERA_REPLY_IF_ERROR(reply, CheckLength("restore file path", path, kMaxPathBytes));
        }
        auto done = [reply](const absl::Status& s) {
          reply(s.ok() ? absl::StatusOr<AssignShardsResponse>(AssignShardsResponse())
                       : absl::StatusOr<AssignShardsResponse>(s));
        };
        if (r->restore_files().empty()) {
          done(store_->Assign(r->shard_map(), r->job(), r->server_id()));
          return;
        }
        files_.Submit([this, r, done] {
          std::vector<tessera::v1::ShardCheckpoint> files(r->restore_files_size());
          for (int i = 0; i < r->restore_files_size(); ++i) {
            absl::StatusOr<CheckpointHeader> read = ReadCheckpointFile(r->restore_files(i), &files[i]);
            if (!read.ok()) {
              done(read.status());
              return;
            }
          }
          done(store_->Assign(r->shard_map(), r->job(), r->server_id(), &files, r->restore_all()));
        });
      });
}

grpc::ServerUnaryReactor* ServerService::Checkpoint(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::CheckpointRequest;
  using tessera::v1::CheckpointResponse;
  return ServeUnary<CheckpointRequest, CheckpointResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const CheckpointRequest> r, UnaryReply<CheckpointResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckControlKey(*context));
        TESSERA_REPLY_IF_ERROR(reply, CheckLength("checkpoint path", r->path(), kMaxPathBytes));
        TESSERA_REPLY_IF_ERROR(reply, CheckLength("delta base path", r->delta_base_path(), kMaxPathBytes));
        files_.Submit([this, context, r, reply] {
          const absl::Duration wait = BoundedWait(r->wait_timeout_ms(), absl::ZeroDuration());
          absl::StatusOr<tessera::v1::ShardCheckpoint> shard =
              store_->Snapshot(r->at_version() ? r->clock() : -1, absl::Now() + wait,
                               [context] { return context->IsCancelled(); }, r->delta_base_path());
          if (!shard.ok()) {
            reply(shard.status());
            return;
          }
          CheckpointHeader header;
          header.job = store_->job_name();
          header.epoch = store_->epoch();
          header.clock = r->clock();
          TESSERA_REPLY_IF_ERROR(reply, WriteCheckpointFile(r->path(), header, *shard));
          CheckpointResponse written;
          written.set_chunks(shard->chunks_size());
          for (const auto& c : shard->chunks()) {
            written.set_bytes(written.bytes() + c.values().size());
            written.set_delta(written.delta() || c.delta());
          }
          if (r->delta_base_path().empty()) store_->NoteFullCheckpoint(r->path(), *shard);
          reply(written);
        });
      });
}

void WriteResponse(const PulledRows& rows, grpc::ByteBuffer* out) {
  *out = SerializeWithPayload(tessera::v1::RowPullResponse(), tessera::v1::RowPullResponse::kValuesFieldNumber,
                              BufferSlice(rows.values, rows.bytes));
}

grpc::ServerUnaryReactor* ServerService::PullRows(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::RowPullRequest;
  return ServeUnary<RowPullRequest, PulledRows>(
      context, request, response, *security_,
      [this](std::shared_ptr<const RowPullRequest> r, UnaryReply<PulledRows> reply) {
        store_->PullRows(std::move(r), reply);  // answered now, or once the round it waits for is applied
      });
}

grpc::ServerUnaryReactor* ServerService::PushRows(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::RowPushRequest;
  using tessera::v1::RowPushResponse;
  return ServeUnary<RowPushRequest, RowPushResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const RowPushRequest> r, UnaryReply<RowPushResponse> reply) {
        auto apply = [this, r, reply, key = std::string(ClientMetadata(*context, kMemberKeyHeader))] {
          store_->PushRows(*r, key, reply);
        };
        if (r->grads().size() >= static_cast<size_t>(inline_update_bytes_)) {
          updates_->Submit(std::move(apply));
        } else {
          apply();
        }
      });
}

grpc::ServerUnaryReactor* ServerService::GetStats(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::ServerStats;
  using tessera::v1::ServerStatsRequest;
  return ServeUnary<ServerStatsRequest, ServerStats>(
      context, request, response, *security_,
      [this](std::shared_ptr<const ServerStatsRequest>, UnaryReply<ServerStats> reply) { reply(store_->Stats()); });
}

grpc::ServerUnaryReactor* ServerService::DecideRounds(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::DecideRoundsRequest;
  using tessera::v1::DecideRoundsResponse;
  return ServeUnary<DecideRoundsRequest, DecideRoundsResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const DecideRoundsRequest> r, UnaryReply<DecideRoundsResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckControlKey(*context));
        TESSERA_REPLY_IF_ERROR(reply, store_->DecideRounds(*r));
        reply(DecideRoundsResponse());
      });
}

grpc::ServerUnaryReactor* ServerService::Shutdown(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  using tessera::v1::ShutdownRequest;
  using tessera::v1::ShutdownResponse;
  return ServeUnary<ShutdownRequest, ShutdownResponse>(
      context, request, response, *security_,
      [this, context](std::shared_ptr<const ShutdownRequest>, UnaryReply<ShutdownResponse> reply) {
        TESSERA_REPLY_IF_ERROR(reply, CheckControlKey(*context));
        on_shutdown_();
        reply(ShutdownResponse());
      });
}

}  // namespace tessera

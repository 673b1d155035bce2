#include "scheduler/grpc_server_control.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc.h"

namespace tessera {
namespace {
constexpr absl::Duration kControlTimeout = absl::Seconds(30);
// Statistics are asked for while the job runs; a server that is gone must not hold up the records for long.
constexpr absl::Duration kStatsTimeout = absl::Seconds(3);
// One server's Checkpoint call in flight.
struct CheckpointCall {
  grpc::ClientContext context;
  tessera::v1::CheckpointRequest request;
  tessera::v1::CheckpointResponse response;
  grpc::Status status;
};
struct CallsProgress {
  absl::Mutex mu;
  int remaining ABSL_GUARDED_BY(mu) = 0;
  bool failed ABSL_GUARDED_BY(mu) = false;
};

// Waits until every call has ended, cancelling those still running at the first failure.
void SettleCalls(CallsProgress& progress, std::vector<std::unique_ptr<CheckpointCall>>& calls) {
  absl::MutexLock lock(&progress.mu);
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress.mu) { return progress.remaining == 0 || progress.failed; };
  progress.mu.Await(absl::Condition(&settled));  // every call has its deadline
  if (progress.remaining > 0) {
    for (auto& call : calls) call->context.TryCancel();
  }
  progress.mu.Await(absl::Condition(+[](int* remaining) { return *remaining == 0; }, &progress.remaining));
}
}  // namespace

tessera::v1::ParameterServer::Stub* GrpcServerControl::StubFor(const std::string& address) {
  return stubs_.Get(address);
}

void GrpcServerControl::SetControlKey(const std::string& address, const std::string& control_key) {
  absl::MutexLock lock(&mu_);
  control_keys_[address] = control_key;
}

void GrpcServerControl::Prepare(grpc::ClientContext& context, const std::string& address, absl::Duration timeout) {
  SetTimeout(context, timeout);
  security_->Authorize(context);
  absl::MutexLock lock(&mu_);
  auto it = control_keys_.find(address);
  if (it != control_keys_.end()) context.AddMetadata(kControlKeyHeader, it->second);
}

absl::Status GrpcServerControl::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                                       const std::vector<std::string>& restore_files, bool restore_all) {
  for (const auto& server : map.servers()) {
    tessera::v1::AssignShardsRequest request;
    *request.mutable_shard_map() = map;
    *request.mutable_job() = job;
    request.set_server_id(server.id());
    for (const std::string& f : restore_files) request.add_restore_files(f);
    request.set_restore_all(restore_all);
    tessera::v1::AssignShardsResponse response;
    grpc::ClientContext context;
    Prepare(context, server.address(), kControlTimeout);
    {
      absl::MutexLock lock(&mu_);
      if (views_ended_) return absl::CancelledError("the job has stopped: no view is handed over any more");
      assigning_.insert(&context);
    }
    absl::Status status =
        FromGrpcStatus(StubFor(server.address())->AssignShards(&context, request, &response), context,
                       absl::StrCat("AssignShards to server ", server.id(), " at ", server.address()));
    {
      absl::MutexLock lock(&mu_);
      assigning_.erase(&context);
    }
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::vector<ServerStatsAnswer> GrpcServerControl::Stats(const tessera::v1::ShardMap& map) {
  std::vector<ServerStatsAnswer> out;
  for (const auto& server : map.servers()) {
    tessera::v1::ServerStats stats;
    grpc::ClientContext context;
    Prepare(context, server.address(), kStatsTimeout);
    absl::Status status = FromGrpcStatus(StubFor(server.address())->GetStats(&context, {}, &stats), context,
                                         absl::StrCat("GetStats from server ", server.id(), " at ", server.address()));
    ServerStatsAnswer answer{server.id(), server.incarnation(), std::move(stats)};
    if (!status.ok()) answer.stats = status;
    out.push_back(std::move(answer));
  }
  return out;
}

absl::Status GrpcServerControl::Probe(const std::string& address, absl::Duration timeout) {
  tessera::v1::ServerStats stats;
  grpc::ClientContext context;
  Prepare(context, address, timeout);
  return FromGrpcStatus(StubFor(address)->GetStats(&context, {}, &stats), context,
                        absl::StrCat("GetStats from ", address));
}

absl::StatusOr<std::vector<std::string>> GrpcServerControl::Checkpoint(const tessera::v1::ShardMap& map,
                                                                       const std::string& folder, int64_t clock,
                                                                       bool at_version, absl::Duration timeout,
                                                                       const std::string& base_folder) {
  // One call per server, all in flight at once, each waiting for its chunks to reach the checkpoint's version;
  // the first failure cancels the others (a server that is gone would otherwise leave the rest waiting for
  // chunks that cannot reach the checkpoint's version).
  auto progress = std::make_shared<CallsProgress>();
  {
    absl::MutexLock lock(&progress->mu);
    progress->remaining = map.servers_size();
  }
  std::vector<std::unique_ptr<CheckpointCall>> calls;
  std::vector<std::string> paths;
  for (const auto& server : map.servers()) {
    auto call = std::make_unique<CheckpointCall>();
    paths.push_back(absl::StrCat(folder, "/server-", server.id(), ".shard"));
    call->request.set_path(paths.back());
    call->request.set_clock(clock);
    call->request.set_at_version(at_version);
    call->request.set_wait_timeout_ms(absl::ToInt64Milliseconds(timeout));
    if (!base_folder.empty()) {
      call->request.set_delta_base_path(absl::StrCat(base_folder, "/server-", server.id(), ".shard"));
    }
    Prepare(call->context, server.address(), timeout + kControlTimeout);
    CheckpointCall* raw = call.get();
    StubFor(server.address())->async()->Checkpoint(&raw->context, &raw->request, &raw->response,
                                                    [raw, progress](grpc::Status s) {
                                                      raw->status = std::move(s);
                                                      absl::MutexLock lock(&progress->mu);
                                                      --progress->remaining;
                                                      progress->failed |= !raw->status.ok();
                                                    });
    calls.push_back(std::move(call));
  }
  SettleCalls(*progress, calls);
  absl::Status first;
  for (int i = 0; i < static_cast<int>(calls.size()); ++i) {
    absl::Status status = FromGrpcStatus(calls[i]->status, calls[i]->context,
                                         absl::StrCat("Checkpoint of server ", map.servers(i).id(), " at ",
                                                      map.servers(i).address()));
    // The cause, not the calls cancelled because of it.
    if (first.ok() || (absl::IsCancelled(first) && !status.ok() && !absl::IsCancelled(status))) first = status;
  }
  if (!first.ok()) return first;
  return paths;
}

absl::Status GrpcServerControl::Shutdown(const tessera::v1::ShardMap& map) {
  absl::Status first;
  for (const auto& server : map.servers()) {
    tessera::v1::ShutdownResponse response;
    grpc::ClientContext context;
    Prepare(context, server.address(), absl::Seconds(5));
    absl::Status status = FromGrpcStatus(StubFor(server.address())->Shutdown(&context, {}, &response), context,
                                         absl::StrCat("Shutdown of server ", server.id(), " at ", server.address()));
    if (first.ok()) first = status;  // try every server even when one fails
  }
  return first;
}

absl::Status GrpcServerControl::DecideRounds(const tessera::v1::ShardMap& map,
                                             const tessera::v1::DecideRoundsRequest& request) {
  absl::Status first;
  for (const auto& server : map.servers()) {
    tessera::v1::DecideRoundsResponse response;
    grpc::ClientContext context;
    Prepare(context, server.address(), absl::Seconds(5));
    absl::Status status =
        FromGrpcStatus(StubFor(server.address())->DecideRounds(&context, request, &response), context,
                       absl::StrCat("DecideRounds on server ", server.id(), " at ", server.address()));
    if (first.ok()) first = status;  // tell every server even when one fails
  }
  return first;
}

void GrpcServerControl::EndViewChanges() {
  absl::MutexLock lock(&mu_);
  views_ended_ = true;
  for (grpc::ClientContext* context : assigning_) context->TryCancel();
}

}  // namespace tessera

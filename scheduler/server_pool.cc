#include "scheduler/server_pool.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc.h"

namespace tessera {
namespace {
constexpr absl::Duration kControlTimeout = absl::Seconds(30);
// Statistics are asked for while the job runs; a server that is gone must not hold up the records for long.
constexpr absl::Duration kStatsTimeout = absl::Seconds(3);
}  // namespace

tessera::v1::ParameterServer::Stub* GrpcServerControl::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (!stub) stub = tessera::v1::ParameterServer::NewStub(MakeChannel(address));
  return stub.get();
}

absl::Status GrpcServerControl::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job) {
  for (const auto& server : map.servers()) {
    tessera::v1::AssignShardsRequest request;
    *request.mutable_shard_map() = map;
    *request.mutable_job() = job;
    request.set_server_id(server.id());
    tessera::v1::AssignShardsResponse response;
    grpc::ClientContext context;
    SetTimeout(context, kControlTimeout);
    absl::Status status =
        FromGrpcStatus(StubFor(server.address())->AssignShards(&context, request, &response), context,
                       absl::StrCat("AssignShards to server ", server.id(), " at ", server.address()));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::vector<ServerStatsAnswer> GrpcServerControl::Stats(const tessera::v1::ShardMap& map) {
  std::vector<ServerStatsAnswer> out;
  for (const auto& server : map.servers()) {
    tessera::v1::ServerStats stats;
    grpc::ClientContext context;
    SetTimeout(context, kStatsTimeout);
    absl::Status status = FromGrpcStatus(StubFor(server.address())->GetStats(&context, {}, &stats), context,
                                         absl::StrCat("GetStats from server ", server.id(), " at ", server.address()));
    ServerStatsAnswer answer{server.id(), server.incarnation(), std::move(stats)};
    if (!status.ok()) answer.stats = status;
    out.push_back(std::move(answer));
  }
  return out;
}

absl::Status GrpcServerControl::Shutdown(const tessera::v1::ShardMap& map) {
  absl::Status first;
  for (const auto& server : map.servers()) {
    tessera::v1::ShutdownResponse response;
    grpc::ClientContext context;
    SetTimeout(context, absl::Seconds(5));
    absl::Status status = FromGrpcStatus(StubFor(server.address())->Shutdown(&context, {}, &response), context,
                                         absl::StrCat("Shutdown of server ", server.id(), " at ", server.address()));
    if (first.ok()) first = status;  // try every server even when one fails
  }
  return first;
}

}  // namespace tessera

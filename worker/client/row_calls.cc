#include "worker/client/row_calls.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/rpc/grpc_status.h"
#include "common/base/status_macros.h"

namespace tessera {

absl::StatusOr<RowTable> FindRowTable(const ShardMapIndex& map, const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(const tessera::v1::ParameterSpec* spec, map.Param(name));
  if (!spec->has_embedding()) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is a dense parameter, not an embedding table"));
  }
  RowTable table;
  table.name = name;
  table.dim = spec->shape(0);
  table.slot_server.assign(EmbeddingSlots(*spec), -1);
  for (const auto& c : map.map().chunks()) {
    if (c.param() == name && c.index() >= 0 && c.index() < static_cast<int>(table.slot_server.size())) {
      table.slot_server[c.index()] = c.server_id();
    }
  }
  return table;
}

std::vector<RowRoute> RouteRows(const RowTable& table, absl::Span<const uint64_t> ids) {
  std::map<int, std::vector<size_t>> by_server;
  const int slots = static_cast<int>(table.slot_server.size());
  for (size_t i = 0; i < ids.size(); ++i) by_server[table.slot_server[EmbeddingSlot(ids[i], slots)]].push_back(i);
  std::vector<RowRoute> routes;
  for (auto& [server, positions] : by_server) routes.push_back(RowRoute{server, std::move(positions)});
  return routes;
}

RowCaller::RowCaller(std::shared_ptr<const Security> security, absl::Duration timeout, ChunkTransport* fabric)
    : security_(security),
      timeout_(timeout),
      fabric_(fabric),
      stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
        return tessera::v1::ParameterServer::NewStub(std::move(channel));
      }) {}

namespace {

// One call's state, kept until its callback ran.
template <typename Request, typename Response>
struct RowCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  absl::Status status;
};

// The stub of `server` in `map`, or UNAVAILABLE when the view no longer has it (its slots are moving).
absl::StatusOr<tessera::v1::ParameterServer::Stub*> StubOf(const ShardMapIndex& map, int server,
                                                           StubCache<tessera::v1::ParameterServer::Stub>& stubs) {
  absl::StatusOr<std::string> address = map.ServerAddress(server);
  if (!address.ok()) {
    return absl::UnavailableError(absl::StrCat("server ", server, " holds rows but is not in the view (epoch ",
                                               map.epoch(), "): its slots are moving"));
  }
  return stubs.Get(*address);
}

// One call per route, all in flight at once: `fill(r, request)` writes route r's request, `start(stub, call,
// done)` starts it on the route's server. Returns each route's status; `calls` keeps each call's response.
template <typename Request, typename Response, typename Fill, typename Start>
std::vector<absl::Status> CallEachRoute(const ShardMapIndex& map, const std::vector<RowRoute>& routes,
                                        StubCache<tessera::v1::ParameterServer::Stub>& stubs, const Security& security,
                                        absl::Duration timeout, const std::string& member_key, const char* what,
                                        Fill fill, Start start,
                                        std::vector<std::unique_ptr<RowCall<Request, Response>>>& calls) {
  std::vector<absl::Status> statuses(routes.size());
  absl::BlockingCounter pending(static_cast<int>(routes.size()));
  for (size_t r = 0; r < routes.size(); ++r) {
    calls.push_back(std::make_unique<RowCall<Request, Response>>());
    RowCall<Request, Response>* call = calls.back().get();
    absl::StatusOr<tessera::v1::ParameterServer::Stub*> stub = StubOf(map, routes[r].server_id, stubs);
    if (!stub.ok()) {
      call->status = stub.status();
      pending.DecrementCount();
      continue;
    }
    fill(r, call->request);
    security.Authorize(call->context);
    if (!member_key.empty()) call->context.AddMetadata(kMemberKeyHeader, member_key);
    SetTimeout(call->context, timeout);
    start(*stub, call, [call, &pending, what](grpc::Status s) {
      // Row calls are never cancelled here: a CANCELLED is the server's, retried as a lost connection.
      call->status = FromGrpcCallStatus(s, call->context, what, /*cancelled_here=*/false);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  for (size_t r = 0; r < routes.size(); ++r) statuses[r] = calls[r]->status;
  return statuses;
}

// The same over the fabric transport: `fill(r, call)` writes route r's row request and its src or dst.
template <typename Fill>
std::vector<absl::Status> CallEachRouteOnFabric(const ShardMapIndex& map, const std::vector<RowRoute>& routes,
                                                ChunkTransport& fabric, const CallerIdentity& who,
                                                absl::Duration timeout, ChunkOp op, Fill fill,
                                                std::vector<std::unique_ptr<ChunkCall>>& calls) {
  std::vector<absl::Status> statuses(routes.size());
  absl::BlockingCounter pending(static_cast<int>(routes.size()));
  // The calls end before this returns: the map needs no owner here.
  const std::shared_ptr<const ShardMapIndex> view(std::shared_ptr<const ShardMapIndex>(), &map);
  for (size_t r = 0; r < routes.size(); ++r) {
    calls.push_back(std::make_unique<ChunkCall>());
    ChunkCall* call = calls.back().get();
    call->op = op;
    call->map = view;
    call->server_id = routes[r].server_id;
    call->timeout = timeout;
    absl::StatusOr<std::string> address = map.ServerAddress(routes[r].server_id);
    absl::Status ready = address.status();
    if (ready.ok()) {
      call->server = *address;
      fill(r, *call);
      ready = fabric.Prepare(*call, who);
    } else {
      ready = absl::UnavailableError(absl::StrCat("server ", routes[r].server_id, " holds rows but is not in the view (epoch ",
                                                  map.epoch(), "): its slots are moving"));
    }
    if (!ready.ok()) {
      call->status = ready;
      pending.DecrementCount();
      continue;
    }
    fabric.Start(call, [&pending] { pending.DecrementCount(); });
  }
  pending.Wait();
  for (size_t r = 0; r < routes.size(); ++r) statuses[r] = calls[r]->status;
  return statuses;
}

}  // namespace

std::vector<absl::Status> RowCaller::Pull(const ShardMapIndex& map, const RowTable& table,
                                          const std::vector<RowRoute>& routes, absl::Span<const uint64_t> ids,
                                          int64_t clock, const Caller& who, absl::Span<float> out) {
  // Over gRPC a route of many ids leaves as several calls in flight together, so that this process's encoding,
  // the wire and the server's lookups overlap instead of running one after the other (1.1x to 1.3x the rows a
  // second to one server, in the benchmark's section s; over UCX, whose one progress thread already streams a
  // call, more calls cost more).
  if (fabric_ != nullptr) return PullRoutes(map, table, routes, ids, clock, who, out);
  std::vector<RowRoute> pieces;
  std::vector<size_t> route_of;  // by piece
  for (size_t r = 0; r < routes.size(); ++r) {
    const std::vector<size_t>& positions = routes[r].positions;
    size_t begin = 0;
    do {
      const size_t end = std::min(positions.size(), begin + kRowsPerPullCall);
      pieces.push_back(RowRoute{routes[r].server_id, {positions.begin() + begin, positions.begin() + end}});
      route_of.push_back(r);
      begin = end;
    } while (begin < positions.size());
  }
  if (pieces.size() == routes.size()) return PullRoutes(map, table, routes, ids, clock, who, out);
  const std::vector<absl::Status> piece_statuses = PullRoutes(map, table, pieces, ids, clock, who, out);
  std::vector<absl::Status> statuses(routes.size());
  for (size_t p = 0; p < pieces.size(); ++p) statuses[route_of[p]].Update(piece_statuses[p]);
  return statuses;
}

std::vector<absl::Status> RowCaller::PullRoutes(const ShardMapIndex& map, const RowTable& table,
                                                const std::vector<RowRoute>& routes, absl::Span<const uint64_t> ids,
                                                int64_t clock, const Caller& who, absl::Span<float> out) {
  auto fill = [&](size_t r, tessera::v1::RowPullRequest& request) {
    request.set_epoch(map.epoch());
    request.set_clock(clock);
    request.set_worker_id(who.worker_id);
    request.set_table(table.name);
    for (size_t i : routes[r].positions) request.add_ids(ids[i]);
  };
  // Each route's answer: its rows' values, in its order.
  std::vector<std::string_view> answers(routes.size());
  std::vector<absl::Status> statuses;
  using Call = RowCall<tessera::v1::RowPullRequest, tessera::v1::RowPullResponse>;
  std::vector<std::unique_ptr<Call>> grpc_calls;
  std::vector<std::unique_ptr<ChunkCall>> fabric_calls;
  std::vector<std::vector<float>> received(routes.size());
  if (fabric_ != nullptr) {
    statuses = CallEachRouteOnFabric(map, routes, *fabric_, who, timeout_, kRowPull,
                                     [&](size_t r, ChunkCall& call) {
                                       fill(r, call.row_pull());
                                       received[r].resize(routes[r].positions.size() * table.dim);
                                       call.dst = absl::MakeSpan(received[r]);
                                     },
                                     fabric_calls);
    for (size_t r = 0; r < routes.size(); ++r) {
      answers[r] = {reinterpret_cast<const char*>(received[r].data()), received[r].size() * sizeof(float)};
    }
  } else {
    statuses = CallEachRoute(
        map, routes, stubs_, *security_, timeout_, /*member_key=*/"", "pull of rows", fill,
        [](tessera::v1::ParameterServer::Stub* stub, Call* call, std::function<void(grpc::Status)> done) {
          stub->async()->PullRows(&call->context, &call->request, &call->response, std::move(done));
        },
        grpc_calls);
    for (size_t r = 0; r < routes.size(); ++r) answers[r] = grpc_calls[r]->response.values();
  }
  const size_t row_bytes = table.dim * sizeof(float);
  for (size_t r = 0; r < routes.size(); ++r) {
    if (!statuses[r].ok()) continue;
    const std::string_view values = answers[r];
    if (values.size() != routes[r].positions.size() * row_bytes) {
      statuses[r] = absl::InternalError(absl::StrCat("server ", routes[r].server_id, " answered ", values.size(),
                                                     " bytes for ", routes[r].positions.size(), " rows"));
      continue;
    }
    for (size_t k = 0; k < routes[r].positions.size(); ++k) {
      std::memcpy(out.data() + routes[r].positions[k] * table.dim, values.data() + k * row_bytes, row_bytes);
    }
  }
  return statuses;
}

std::vector<absl::Status> RowCaller::Push(const ShardMapIndex& map, const std::vector<RowRoute>& routes,
                                          const tessera::v1::RowPushRequest& request, absl::Span<const uint64_t> ids,
                                          absl::Span<const float> grads, int64_t dim, const Caller& who,
                                          int64_t& updated, int64_t& refused, bool& late) {
  auto fill = [&](size_t r, tessera::v1::RowPushRequest& sent) {
    sent = request;
    sent.set_epoch(map.epoch());
    sent.set_worker_id(who.worker_id);
    sent.set_incarnation(who.incarnation);
    std::string* bytes = sent.mutable_grads();
    bytes->resize(routes[r].positions.size() * dim * sizeof(float));
    for (size_t k = 0; k < routes[r].positions.size(); ++k) {
      const size_t i = routes[r].positions[k];
      sent.add_ids(ids[i]);
      std::memcpy(bytes->data() + k * dim * sizeof(float), grads.data() + i * dim, dim * sizeof(float));
    }
  };
  std::vector<absl::Status> statuses;
  std::vector<const tessera::v1::RowPushResponse*> answers(routes.size());
  using Call = RowCall<tessera::v1::RowPushRequest, tessera::v1::RowPushResponse>;
  std::vector<std::unique_ptr<Call>> grpc_calls;
  std::vector<std::unique_ptr<ChunkCall>> fabric_calls;
  std::vector<std::string> route_grads(routes.size());  // the fabric's gradients, sent as the message's data
  if (fabric_ != nullptr) {
    statuses = CallEachRouteOnFabric(map, routes, *fabric_, who, timeout_, kRowPush,
                                     [&](size_t r, ChunkCall& call) {
                                       fill(r, call.row_push());
                                       route_grads[r] = std::move(*call.row_push().mutable_grads());
                                       call.row_push().clear_grads();
                                       call.src = route_grads[r];
                                     },
                                     fabric_calls);
    for (size_t r = 0; r < routes.size(); ++r) answers[r] = &fabric_calls[r]->rows_pushed;
  } else {
    statuses = CallEachRoute(
        map, routes, stubs_, *security_, timeout_, who.member_key, "push of rows", fill,
        [](tessera::v1::ParameterServer::Stub* stub, Call* call, std::function<void(grpc::Status)> done) {
          stub->async()->PushRows(&call->context, &call->request, &call->response, std::move(done));
        },
        grpc_calls);
    for (size_t r = 0; r < routes.size(); ++r) answers[r] = &grpc_calls[r]->response;
  }
  for (size_t r = 0; r < routes.size(); ++r) {
    if (!statuses[r].ok()) continue;
    updated += answers[r]->rows_updated();
    refused += answers[r]->rows_refused();
    late = late || answers[r]->late();
  }
  return statuses;
}

}  // namespace tessera

#include "worker/client/row_client.h"

#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/row_batch.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"

namespace tessera {
namespace {

// The distinct ids of `ids` in the order they first appear, and where each of `ids` is among them; `all_distinct`
// when no id repeats (the distinct ids are then `ids` themselves, in order).
struct DistinctIds {
  std::vector<uint64_t> ids;
  std::vector<size_t> of;  // ids[i] is distinct ids[of[i]]
  bool all_distinct = true;
};
DistinctIds Distinct(absl::Span<const uint64_t> ids) {
  DistinctIds d;
  absl::flat_hash_map<uint64_t, size_t> place;
  place.reserve(ids.size());
  d.ids.reserve(ids.size());
  d.of.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto [it, inserted] = place.try_emplace(ids[i], d.ids.size());
    if (inserted) d.ids.push_back(ids[i]);
    d.of[i] = it->second;
  }
  d.all_distinct = d.ids.size() == ids.size();
  return d;
}

}  // namespace

RowClient::RowClient(std::unique_ptr<RowCaller> caller, CallRetries* retries,
                     const std::shared_ptr<const ShardMapIndex>& view)
    : caller_(std::move(caller)), retries_(retries), view_(view) {}

absl::Status RowClient::Run(const std::string& table_name, absl::Span<const uint64_t> ids, const Calls& call,
                            bool every_server) {
  if (view_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  std::vector<bool> done(ids.size(), false);
  std::set<int> answered;  // servers that took a call (every_server)
  return retries_->Run(
      [&](FailedCalls& failed) -> absl::Status {
        const ShardMapIndex& map = *view_;
        TESSERA_ASSIGN_OR_RETURN(RowTable table, FindRowTable(map, table_name));
        std::vector<size_t> todo;
        std::vector<uint64_t> todo_ids;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (done[i]) continue;
          todo.push_back(i);
          todo_ids.push_back(ids[i]);
        }
        std::vector<RowRoute> routes = RouteRows(table, todo_ids);
        for (RowRoute& route : routes) {
          for (size_t& p : route.positions) p = todo[p];  // back to positions in `ids`
        }
        if (every_server) {
          std::set<int> routed;
          for (const RowRoute& route : routes) routed.insert(route.server_id);
          for (int server : std::set<int>(table.slot_server.begin(), table.slot_server.end())) {
            if (server >= 0 && routed.count(server) == 0 && answered.count(server) == 0) {
              routes.push_back(RowRoute{server, {}});
            }
          }
        }
        const std::vector<absl::Status> statuses = call(map, table, routes);
        for (size_t r = 0; r < routes.size(); ++r) {
          if (statuses[r].ok()) {
            for (size_t p : routes[r].positions) done[p] = true;
            answered.insert(routes[r].server_id);
          } else {
            TESSERA_RETURN_IF_ERROR(failed.Add(statuses[r], map, routes[r].server_id));
          }
        }
        return absl::OkStatus();
      },
      /*void_on_rollback=*/false);
}

absl::StatusOr<int64_t> RowClient::Pull(const std::string& table, absl::Span<const uint64_t> ids,
                                        absl::Span<float> out, int64_t clock, const CallerIdentity& who) {
  if (view_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  TESSERA_ASSIGN_OR_RETURN(RowTable found, FindRowTable(*view_, table));
  if (out.size() != ids.size() * found.dim) {
    return absl::InvalidArgumentError(absl::StrCat("pull of ", ids.size(), " rows of '", table, "' (", found.dim,
                                                   " values each) into ", out.size(), " floats"));
  }
  const DistinctIds distinct = Distinct(ids);
  // Each distinct row is pulled once: straight into `out` when no id repeats, else into a buffer spread from.
  const size_t floats = distinct.ids.size() * found.dim;
  std::unique_ptr<float[]> spread(distinct.all_distinct ? nullptr : new float[floats]);
  const absl::Span<float> rows = distinct.all_distinct ? out : absl::MakeSpan(spread.get(), floats);
  TESSERA_RETURN_IF_ERROR(
      Run(table, distinct.ids,
          [&](const ShardMapIndex& map, const RowTable& t, const std::vector<RowRoute>& routes) {
            return caller_->Pull(map, t, routes, distinct.ids, clock, who, rows);
          },
          /*every_server=*/false));
  if (!distinct.all_distinct) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::copy_n(rows.begin() + distinct.of[i] * found.dim, found.dim, out.begin() + i * found.dim);
    }
  }
  return static_cast<int64_t>(floats * sizeof(float));
}

absl::StatusOr<RowsPushed> RowClient::Push(tessera::v1::RowPushRequest request, absl::Span<const uint64_t> ids,
                                                  absl::Span<const float> grads, bool every_server,
                                                  const CallerIdentity& who) {
  if (view_ == nullptr) return absl::FailedPreconditionError("no parameters declared yet: call Declare first");
  const std::string& table = request.table();
  TESSERA_ASSIGN_OR_RETURN(RowTable found, FindRowTable(*view_, table));
  if (grads.size() != ids.size() * found.dim) {
    return absl::InvalidArgumentError(absl::StrCat("push of ", ids.size(), " rows of '", table, "' (", found.dim,
                                                   " values each) with ", grads.size(), " floats"));
  }
  // Checked here too, so that a bad gradient reaches no server (one server's rows applied, another's refused).
  TESSERA_RETURN_IF_ERROR(CheckFinite(grads, absl::StrCat("gradient of rows of '", table, "'")));
  TESSERA_ASSIGN_OR_RETURN(RowGradients summed, SumDuplicates(ids, grads, found.dim));
  RowsPushed pushed;
  TESSERA_RETURN_IF_ERROR(Run(
      table, summed.ids,
      [&](const ShardMapIndex& map, const RowTable& t, const std::vector<RowRoute>& routes) {
        return caller_->Push(map, routes, request, summed.ids, summed.grads, t.dim, who, pushed.updated,
                             pushed.refused, pushed.late);
      },
      every_server));
  return pushed;
}

}  // namespace tessera

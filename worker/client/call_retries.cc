#include "worker/client/call_retries.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc.h"
#include "common/rpc/scheduler_client.h"
#include "glog/logging.h"

namespace tessera {

absl::Status FailedCalls::Add(const absl::Status& status, const ShardMapIndex& map, int server_id) {
  std::optional<uint64_t> epoch = GetCurrentEpoch(status);
  const bool stale = status.code() == absl::StatusCode::kFailedPrecondition && epoch.has_value();
  if (!stale && status.code() != absl::StatusCode::kUnavailable) return status;  // the caller must fix it
  if (epoch.has_value()) newer_epoch_ = std::max(newer_epoch_, *epoch);
  if (absl::StatusOr<const tessera::v1::ServerInfo*> server = map.Server(server_id);
      server.ok() && !epoch.has_value()) {  // (a server that says its epoch answered: it is not unreachable)
    unreachable_.emplace(std::make_pair(server_id, (*server)->incarnation()), status);
  }
  last_ = status;
  any_ = true;
  return absl::OkStatus();
}

void FailedCalls::AddUnplaced(const absl::Status& status) {
  last_ = status;
  any_ = true;
}

CallRetries::CallRetries(Options options, SchedulerClient* scheduler, int worker_id, RefreshMap refresh,
                         PendingRollback rollback)
    : options_(options),
      scheduler_(scheduler),
      worker_id_(worker_id),
      refresh_(std::move(refresh)),
      rollback_(std::move(rollback)) {}

absl::Status CallRetries::Run(const Attempt& attempt, bool void_on_rollback) {
  Backoff backoff(absl::Milliseconds(20), absl::Seconds(1));
  absl::Status last;
  // A server that died is replaced in the cluster view within the scheduler's heartbeat timeout, and the map is
  // asked for again on each attempt.
  const absl::Time keep_trying_until = absl::Now() + options_.unavailable_window;
  int attempts = 0;
  for (; attempts <= options_.retries || absl::Now() < keep_trying_until; ++attempts) {
    FailedCalls failed;
    TESSERA_RETURN_IF_ERROR(attempt(failed));
    if (!failed.any()) return absl::OkStatus();
    last = failed.last();
    ReportUnreachable(failed.unreachable());
    if (failed.newer_epoch() > 0) {
      // A server takes a new view a moment before the scheduler commits it (a declaration, a join): until then
      // the scheduler's map is older, and the call waits and tries again.
      bool behind = false;
      if (absl::Status refreshed = refresh_(failed.newer_epoch(), &behind); !refreshed.ok()) {
        if (!behind) return refreshed;
        last = std::move(refreshed);
        backoff.Wait();
      }
    } else {
      backoff.Wait();
      // The server may be gone and its chunks elsewhere by now.
      TESSERA_RETURN_IF_ERROR(refresh_(0, nullptr));
    }
    if (scheduler_->stopping()) {
      // Nothing will move or come back once the job is stopping (a server lost without a checkpoint): the step
      // ends here and the gate says stop.
      return absl::AbortedError(absl::StrCat("the job is stopping: ", last.message()));
    }
    if (void_on_rollback) {
      if (std::optional<int64_t> clock = rollback_()) {
        return absl::AbortedError(
            absl::StrCat("the job was rolled back to clock ", *clock, " (a server was lost); this step is void"));
      }
    }
  }
  return Annotate(last, absl::StrCat("gave up after ", attempts, " attempts"));
}

void CallRetries::ReportUnreachable(const std::map<std::pair<int, uint64_t>, absl::Status>& servers) {
  if (scheduler_->stopping()) return;
  const absl::Time now = absl::Now();
  for (const auto& [server, error] : servers) {
    absl::Time& last = reported_[server.first];
    if (now - last < absl::Seconds(1)) continue;
    last = now;
    if (absl::Status told = scheduler_->ReportServer(tessera::v1::WORKER, worker_id_, server.first, server.second, error);
        !told.ok()) {
      VLOG(1) << "worker " << worker_id_ << ": telling the scheduler of server " << server.first << ": " << told;
    }
  }
}

}  // namespace tessera

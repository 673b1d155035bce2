#include "scheduler/recovery/job_take_back.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/security.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"

namespace tessera {

namespace {
// A server coming back to a restarted scheduler vouches for the view it brings with its member key: the view
// must name the caller's own slot with the caller's incarnation and the digest of that key (an empty view,
// nothing placed yet, names nobody and carries nothing to take). UNAUTHENTICATED otherwise, before anything of
// the call is kept.
absl::Status VouchForOwnView(const tessera::v1::RegisterRequest& request, const std::string& key) {
  const tessera::v1::MemberReturn& rejoin = request.rejoin();
  const int id = request.requested_id();
  if (key.empty()) return absl::UnauthenticatedError("a member comes back with the member key it was given");
  const tessera::v1::ShardMap& view = rejoin.view();
  if (view.servers().empty() && view.workers().empty() && view.params().empty()) return absl::OkStatus();
  for (const tessera::v1::ServerInfo& s : view.servers()) {
    if (s.id() != id) continue;
    if (s.incarnation() != rejoin.incarnation()) {
      return absl::UnauthenticatedError(absl::StrCat("server ", id, " came back as incarnation ", rejoin.incarnation(),
                                                     " with a view that holds incarnation ", s.incarnation()));
    }
    return CheckSecret(KeyDigest(key), s.key_digest(), absl::StrCat("server ", id, " coming back with its view"));
  }
  return absl::UnauthenticatedError(absl::StrCat("server ", id, " came back with a view that does not name it"));
}
}  // namespace

void JobTakeBack::ExpectMembersUntil(absl::Time until) {
  absl::MutexLock lock(&mu_);
  afresh_after_ = until;
}

bool JobTakeBack::Pending() const {
  absl::MutexLock lock(&mu_);
  return !started_afresh_ && !taken_back_;
}

absl::Status JobTakeBack::AdmitAfresh() {
  absl::MutexLock lock(&mu_);
  if (started_afresh_ || taken_back_) return absl::OkStatus();
  // The members of a job this scheduler may take back come first: a process registering afresh meanwhile (one
  // restarted at the same time) waits for the job it would join.
  if (!returning_servers_.empty()) {
    return absl::UnavailableError("the restarted scheduler is taking its job back from the servers; retry");
  }
  if (absl::Now() < afresh_after_) {
    return absl::UnavailableError(absl::StrCat(
        "the scheduler restarted on an unfinished run and waits for its members to come back (up to ",
        absl::FormatDuration(absl::Trunc(afresh_after_ - absl::Now(), absl::Seconds(1))),
        " more) before a job starts afresh; retry"));
  }
  started_afresh_ = true;
  if (afresh_after_ != absl::InfinitePast()) {
    LOG(WARNING) << "no member of the unfinished run came back within the heartbeat timeout: the job starts "
                    "afresh, and the run's earlier records move aside";
    if (absl::Status moved = parts_.records->StartAfresh(); !moved.ok()) {
      LOG(WARNING) << "the earlier records stay beside the new ones: " << moved;
    }
  }
  return absl::OkStatus();
}

absl::Status JobTakeBack::CheckReturn(const tessera::v1::RegisterRequest& request) const {
  const bool server = request.role() == tessera::v1::SERVER;
  if (!server && request.role() != tessera::v1::WORKER) {
    return absl::InvalidArgumentError("a member comes back as a SERVER or a WORKER");
  }
  if (request.rejoin().job() != parts_.job->name()) {
    return absl::FailedPreconditionError(absl::StrCat("this scheduler runs job '", parts_.job->name(), "', not '",
                                                      request.rejoin().job().substr(0, kMaxNameBytes), "'"));
  }
  if (!request.has_requested_id() || request.requested_id() < 0 ||
      request.requested_id() >= (server ? parts_.view->num_servers() : parts_.view->num_workers())) {
    return absl::InvalidArgumentError("a member comes back to the slot it held (requested_id within the job)");
  }
  return absl::OkStatus();
}

absl::StatusOr<Member> JobTakeBack::Take(const tessera::v1::RegisterRequest& request, const std::string& key) {
  TESSERA_RETURN_IF_ERROR(CheckReturn(request));
  std::optional<tessera::v1::ShardMap> adopt;
  {
    absl::MutexLock lock(&mu_);
    if (started_afresh_) {
      return absl::FailedPreconditionError(
          "this scheduler started its job afresh (a member registered before any came back): register anew");
    }
    if (!taken_back_) {
      if (request.role() != tessera::v1::SERVER) {
        return absl::UnavailableError("the restarted scheduler takes its job back from the servers first; retry");
      }
      TESSERA_ASSIGN_OR_RETURN(adopt, Gather(request, key));
      taken_back_ = true;
    }
  }
  absl::StatusOr<Member> member = adopt ? AdoptGathered(*adopt, request.requested_id()) : ComeBack(request, key);
  if (!member.ok()) {
    LOG(WARNING) << (request.role() == tessera::v1::SERVER ? "server " : "worker ") << request.requested_id()
                 << " could not come back: " << member.status();
  }
  return member;
}

absl::StatusOr<tessera::v1::ShardMap> JobTakeBack::Gather(const tessera::v1::RegisterRequest& request,
                                                          const std::string& key) {
  const int id = request.requested_id();
  // A view from the wire: checked, and vouched for by the caller's key, before anything is taken from it.
  if (absl::Status valid = ValidateShardMap(request.rejoin().view(), *parts_.job); !valid.ok()) {
    return Annotate(valid, "the view a server came back with");
  }
  TESSERA_RETURN_IF_ERROR(VouchForOwnView(request, key));
  if (auto claimed = returning_servers_.find(id); claimed != returning_servers_.end() && claimed->second.key != key) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", id, " came back already, with another key: a slot is taken back by one process"));
  }
  const absl::Time now = absl::Now();
  if (returning_servers_.empty()) gathering_since_ = now;
  returning_servers_[id] = Returning{request, key, next_return_++};
  // The newest view of the run most servers came back with is the job's; every server it names should be back
  // before it is taken.
  const tessera::v1::ShardMap* newest = ViewToTakeBack();
  std::vector<int> missing;
  if (newest->params_size() > 0) {
    for (const auto& s : newest->servers()) {
      if (!returning_servers_.count(s.id())) missing.push_back(s.id());
    }
  } else {
    for (int s = 0; s < parts_.view->num_servers(); ++s) {
      if (!returning_servers_.count(s)) missing.push_back(s);
    }
  }
  const absl::Duration window = 3 * heartbeat_interval_;
  if (!missing.empty() && now - gathering_since_ < window) {
    return absl::UnavailableError(absl::StrCat("the restarted scheduler waits for server(s) ",
                                               absl::StrJoin(missing, ", "), " to come back (up to ",
                                               absl::FormatDuration(window), ") before taking the job back; retry"));
  }
  return *newest;
}

const tessera::v1::ShardMap* JobTakeBack::ViewToTakeBack() const {
  // The run most servers' views belong to (views without parameters belong to none); a tie goes to the run
  // brought back first.
  std::map<std::string, std::pair<int, uint64_t>> runs;  // run id -> (views, first arrival)
  for (const auto& [sid, r] : returning_servers_) {
    const tessera::v1::ShardMap& view = r.request.rejoin().view();
    if (view.params().empty()) continue;
    auto it = runs.try_emplace(view.run_id(), 0, r.arrival).first;
    ++it->second.first;
    it->second.second = std::min(it->second.second, r.arrival);
  }
  const std::string* run = nullptr;
  std::pair<int, uint64_t> best{0, 0};
  for (const auto& [id, count] : runs) {
    if (run == nullptr || count.first > best.first || (count.first == best.first && count.second < best.second)) {
      run = &id;
      best = count;
    }
  }
  const tessera::v1::ShardMap* newest = nullptr;
  for (const auto& [sid, r] : returning_servers_) {
    const tessera::v1::ShardMap& view = r.request.rejoin().view();
    if (run != nullptr && (view.params().empty() || view.run_id() != *run)) continue;
    if (newest == nullptr || view.epoch() > newest->epoch()) newest = &view;
  }
  return newest;
}

absl::StatusOr<Member> JobTakeBack::AdoptGathered(const tessera::v1::ShardMap& view, int caller) {
  const absl::Time now = absl::Now();
  parts_.view->Adopt(view, now);
  // Workers hold the gate at the clocks they joined at until they come back with theirs; lost ones leave it.
  for (const Member& w : parts_.view->Workers()) {
    if (w.state == MemberState::kAlive) parts_.clocks->Rejoin(w.id, w.joined_clock);
    if (w.state == MemberState::kLost) parts_.clocks->Done(w.id);
  }
  std::map<int, Returning> gathered;
  {
    absl::MutexLock lock(&mu_);
    gathered.swap(returning_servers_);
  }
  absl::StatusOr<Member> own = absl::InternalError("not among the servers gathered");
  for (const auto& [id, r] : gathered) {
    absl::StatusOr<Member> back = parts_.view->Return(r.request, r.key, now);
    if (back.ok()) Returned(*back, 0);
    if (id == caller) own = back;
    else if (!back.ok()) LOG(WARNING) << "server " << id << " could not come back: " << back.status();
  }
  LoadRunsCheckpoint(view);
  parts_.view->AdvanceEpochPast(view.epoch());
  parts_.records->AddEvent({{"event", "scheduler restarted, job taken back"},
                            {"epoch_taken", view.epoch()},
                            {"servers_back", gathered.size()},
                            {"placed", view.params_size() > 0}});
  LOG(INFO) << "took the job back from " << gathered.size() << " server(s): cluster view epoch " << view.epoch()
            << (view.params_size() > 0 ? "" : " (nothing placed yet)");
  publish_view_("the restarted scheduler took the job back");
  return own;
}

void JobTakeBack::LoadRunsCheckpoint(const tessera::v1::ShardMap& view) {
  // This run's (not an earlier run's of the job in the same folder).
  Checkpointer& checkpointer = *parts_.checkpointer;
  if (!checkpointer.enabled()) return;
  absl::StatusOr<CheckpointInfo> latest = Checkpointer::LoadLatest(checkpointer.dir(), parts_.job->name());
  if (latest.ok() && latest->state.view().run_id() == view.run_id() &&
      Checkpointer::CheckResumable(*parts_.job, *latest).ok()) {
    LOG(INFO) << "the run's latest checkpoint: " << latest->folder << " at clock " << latest->state.clock();
    checkpointer.set_latest(*latest);
  } else {
    LOG(INFO) << "no checkpoint of this run in " << checkpointer.dir()
              << (latest.ok() ? absl::StrCat(" (", latest->folder, " is another run's)") : "");
  }
}

absl::StatusOr<Member> JobTakeBack::ComeBack(const tessera::v1::RegisterRequest& request, const std::string& key) {
  const bool server = request.role() == tessera::v1::SERVER;
  const int id = request.requested_id();
  const bool was_awaited = (server ? parts_.view->Servers() : parts_.view->Workers())[id].awaited;
  TESSERA_ASSIGN_OR_RETURN(Member member, parts_.view->Return(request, key, absl::Now()));
  Returned(member, request.rejoin().clock(), request.rejoin().pushed_from());
  // A server back after the job was taken back, or a worker that took its slot anew, changes what the servers
  // hold: a new epoch (past any a late server brings).
  if (server || !was_awaited) {
    parts_.view->AdvanceEpochPast(server ? request.rejoin().view().epoch() : 0);
    publish_view_(absl::StrCat(member.Describe(), " came back to the restarted scheduler"));
  }
  return member;
}

void JobTakeBack::Returned(const Member& member, int64_t clock, int64_t pushed_from) {
  if (member.role == tessera::v1::SERVER) {
    parts_.servers->SetControlKey(member.address, member.control_key);
  } else {
    parts_.clocks->Rejoin(member.id, clock, pushed_from);
  }
}

}  // namespace tessera

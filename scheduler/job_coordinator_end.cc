// JobCoordinator's end of a job: workers done or lost, the job failing or stopping, its verdict, and the
// summary written when it finishes (job_coordinator.h). The rest of the coordinator is in job_coordinator.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"
#include "scheduler/job_coordinator.h"

namespace tessera {

absl::Status JobCoordinator::Done(const tessera::v1::DoneRequest& request) {
  if (request.worker_id() < 0 || request.worker_id() >= job_.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("done from unknown worker ", request.worker_id()));
  }
  TESSERA_RETURN_IF_ERROR(CheckLength("done: failure", request.failure(), kMaxErrorBytes));
  const std::string not_in_job =
      absl::StrCat("done from worker ", request.worker_id(), ", which is not in the job (lost, or done before)");
  // Leaving is a membership change: its subscribers (OnMembership among them) take it from here.
  if (!request.failure().empty() && !clocks_.stopped()) {
    if (request.program_error() && job_.cluster().worker_errors() == tessera::v1::ClusterSpec::FAIL_JOB) {
      // A bug in the training program: the job fails now (cluster.worker_errors), before the worker leaves, so
      // that its leaving finds the job stopped and ends it.
      if (view_.Workers()[request.worker_id()].state != MemberState::kAlive) {
        return absl::FailedPreconditionError(not_in_job);
      }
      FailJob(absl::StrCat("worker ", request.worker_id(), " failed at clock ", request.clock(), ": ",
                           request.failure(), " (an error of its training program: cluster.worker_errors is FAIL_JOB)"));
    }
    if (!view_.Leave(request.worker_id(), MemberState::kLost, request.failure())) {
      return absl::FailedPreconditionError(not_in_job);
    }
    return absl::OkStatus();
  }
  if (!request.failure().empty()) {
    // The job had stopped (complete, failed or asked to): a worker whose last calls failed then (to a server that
    // is gone or frozen) stopped because the job did. It is done, not lost; its error goes into the events, before
    // it leaves (its leaving may end the job and write the summary).
    if (view_.Workers()[request.worker_id()].state != MemberState::kAlive) {
      return absl::FailedPreconditionError(not_in_job);
    }
    LOG(INFO) << "worker " << request.worker_id() << " stopped with the job at clock " << request.clock() << ": "
              << request.failure();
    records_.AddEvent({{"event", "worker stopped with the job"},
                       {"worker", request.worker_id()},
                       {"clock", request.clock()},
                       {"error", request.failure()}});
    if (!view_.Leave(request.worker_id(), MemberState::kDone)) return absl::FailedPreconditionError(not_in_job);
    return absl::OkStatus();
  }
  if (!view_.Leave(request.worker_id(), MemberState::kDone)) return absl::FailedPreconditionError(not_in_job);
  LOG(INFO) << "worker " << request.worker_id() << " done at clock " << request.clock();
  return absl::OkStatus();
}

void JobCoordinator::WorkerLost(const Member& m, const std::string& failure) {
  const int64_t clock = clocks_.Clocks()[m.id];
  LOG(WARNING) << (failure.empty() ? absl::StrCat(m.Describe(), " lost: no heartbeat for ",
                                                  absl::FormatDuration(failure_detector_.timeout()), " at clock ",
                                                  clock)
                                   : absl::StrCat(m.Describe(), " failed at clock ", clock, ": ", failure))
               << (clocks_.stopped() ? "" : "; the others go on without it (it may rejoin)");
  {
    absl::MutexLock lock(&mu_);
    lost_workers_.push_back(m.id);
    if (failure.empty()) {
      worker_failures_.erase(m.id);
    } else {
      worker_failures_[m.id] = failure;
      last_failure_report_ = absl::Now();
    }
  }
  executor_.Submit([this, why = absl::StrCat("worker ", m.id, " left")] { PublishView(why); });
  MaybeFinish();
}

void JobCoordinator::FailJob(const std::string& reason) {
  if (Completed()) {
    // The workers may still be finishing (a last evaluation): the job's end is theirs, and its verdict stands.
    LOG(WARNING) << reason << " (after the job completed: not a failure)";
    records_.AddEvent({{"event", "loss after the job completed"}, {"error", reason}});
    return;
  }
  LOG(ERROR) << reason;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) failure_ = reason;
  }
  StopClocks(reason);
}

void JobCoordinator::StopClocks(const std::string& why) {
  clocks_.Stop(why);
  servers_->EndViewChanges();  // a stopped job hands no view over: none may hold its end back
}

void JobCoordinator::StopCompleted(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) completed_ = true;
  }
  StopClocks(why);
}

bool JobCoordinator::Completed() {
  {
    absl::MutexLock lock(&mu_);
    if (completed_ || !failure_.empty()) return completed_;
  }
  // Read before mu_ is taken again (the view and the clock table have locks of their own).
  const int64_t last_step = job_.stop().max_steps();
  const std::vector<int64_t> clocks = clocks_.Clocks();
  bool ran_its_course = false, still_training = false;
  for (const Member& w : view_.Workers()) {
    const bool at_end = w.state == MemberState::kDone ||
                        (w.state == MemberState::kAlive && last_step > 0 && clocks[w.id] >= last_step);
    ran_its_course |= at_end;
    still_training |= !at_end && w.state != MemberState::kLost;
  }
  absl::MutexLock lock(&mu_);
  if (failure_.empty() && ran_its_course && !still_training) completed_ = true;
  return completed_;
}

void JobCoordinator::Abort(const std::string& reason) {
  const bool completed = Completed();
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty() && !finishing_ && !completed) failure_ = reason;
  }
  StopClocks(reason);
}

void JobCoordinator::EndAStopNobodyFinishes() {
  if (!clocks_.stopped()) return;
  const absl::Time now = absl::Now();
  absl::Time stopped_at;
  {
    absl::MutexLock lock(&mu_);
    // A failed job, or one that completed (the target reached, stop.max_seconds); a stop asked for (a signal)
    // lets the workers finish their step for as long as the scheduler's --stop_grace_ms says.
    if (finishing_ || (failure_.empty() && !completed_)) return;
    if (stopped_seen_at_ == absl::InfiniteFuture()) stopped_seen_at_ = now;
    // Workers hear of the stop from their next heartbeat or gate and finish their step (after a completed one,
    // their last evaluation too); one that has not within a heartbeat timeout (twice that for a completed job)
    // is stuck, waiting on a server that is gone, and the job ends without it, its verdict unchanged.
    stopped_at = stopped_seen_at_;
    if (now - stopped_at < (failure_.empty() ? 2 : 1) * failure_detector_.timeout()) return;
    finishing_ = true;
  }
  std::vector<std::string> running;
  for (const Member& w : view_.Workers()) {
    if (w.state == MemberState::kAlive) running.push_back(absl::StrCat("worker ", w.id));
  }
  LOG(WARNING) << "the job stopped (" << clocks_.stop_reason() << ") " << absl::FormatDuration(now - stopped_at)
               << " ago and " << absl::StrJoin(running, ", ") << " did not finish: ending it without them";
  executor_.Submit([this] { FinishJob(); });
}

void JobCoordinator::FinishNow() {
  {
    absl::MutexLock lock(&mu_);
    if (!finishing_) {
      finishing_ = true;
      // On the executor, like every end of the job: never beside a recovery or a view change it runs.
      executor_.Submit([this] { FinishJob(); });
    }
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&finished_));
}

void JobCoordinator::MaybeFinish() {
  bool any_alive = false, any_vacant = false, any_done = false;
  for (const Member& w : view_.Workers()) {
    any_alive |= w.state == MemberState::kAlive;
    any_vacant |= w.state == MemberState::kVacant;
    any_done |= w.state == MemberState::kDone;
  }
  // A job that completed (its target reached, say) stays so when its workers are lost after that.
  const bool completed = Completed();
  absl::MutexLock lock(&mu_);
  // Ranks nobody holds yet hold the end back until the job is stopped (stop.max_seconds included).
  const bool stopped = clocks_.stopped();
  if (any_alive || (any_vacant && !stopped) || finishing_) return;
  if (!any_done && failure_.empty() && !completed && !any_vacant) {
    // A worker that stopped on an error may be started again (a launcher's restart, a pod's): the job waits for
    // it as long as for one that fell silent. The ticker asks again.
    if (absl::Now() < last_failure_report_ + failure_detector_.timeout()) return;
    std::vector<std::string> lost;
    const std::vector<int64_t> clocks = clocks_.Clocks();
    for (const Member& w : view_.Workers()) {
      lost.push_back(absl::StrCat("worker ", w.id, " at clock ", clocks[w.id]));
      if (auto failed = worker_failures_.find(w.id); failed != worker_failures_.end()) {
        absl::StrAppend(&lost.back(), ", which failed: ", failed->second);
      }
    }
    // Errors may hold commas: the workers are parted by semicolons when any failed.
    failure_ = absl::StrCat("every worker was lost (", absl::StrJoin(lost, worker_failures_.empty() ? ", " : "; "), ")");
  }
  finishing_ = true;
  executor_.Submit([this] { FinishJob(); });
}

void JobCoordinator::FinishJob() {
  std::optional<tessera::v1::ShardMap> map = view_.Map();
  if (map) records_.UpdateServerStats(servers_->Stats(*map));
  JobOutcome outcome;
  std::vector<int> lost;
  {
    absl::MutexLock lock(&mu_);
    lost = lost_workers_;
    outcome.completed = failure_.empty();
    outcome.stop_reason = failure_;
  }
  if (outcome.stop_reason.empty()) {
    outcome.stop_reason = clocks_.stop_reason();
    if (outcome.stop_reason.empty()) {
      outcome.stop_reason = "every worker reached its last step (stop.max_steps / stop.epochs)";
    }
  }
  // Steps: the clocks of the workers that stayed in the job (or of all, when every one was lost).
  const std::vector<int64_t> clocks = clocks_.Clocks();
  std::vector<int64_t> stayed;
  for (const Member& w : view_.Workers()) {
    if (w.state != MemberState::kLost) stayed.push_back(clocks[w.id]);
  }
  nlohmann::json summary = records_.SaveSummary(outcome, clocks, stayed.empty() ? clocks : stayed, lost,
                                                {{"balance", balancer_.ToJson()},
                                                 {"rounds", pages_.RoundsJson()},
                                                 {"checkpoints", pages_.CheckpointsJson()}});
  {
    absl::MutexLock lock(&mu_);
    summary_ = summary;
    finished_ = true;
  }
  // The printed line is what a launcher or a log reader takes for the job's end: /status agrees from here on.
  records_.PrintSummary(summary);
  if (map) {
    if (absl::Status s = servers_->Shutdown(*map); !s.ok()) LOG(WARNING) << s;
  }
  on_finished_(outcome);
}

nlohmann::json JobCoordinator::summary() const {
  absl::MutexLock lock(&mu_);
  return summary_;
}

bool JobCoordinator::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

}  // namespace tessera

#include "scheduler/job_end.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"

namespace tessera {

JobEnd::JobEnd(Parts parts, absl::Duration heartbeat_timeout, std::function<void(const JobOutcome&)> on_finished)
    : parts_(parts), heartbeat_timeout_(heartbeat_timeout), on_finished_(std::move(on_finished)) {}

absl::Status JobEnd::WorkerDone(const tessera::v1::DoneRequest& request) {
  if (request.worker_id() < 0 || request.worker_id() >= parts_.job->cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("done from unknown worker ", request.worker_id()));
  }
  TESSERA_RETURN_IF_ERROR(CheckLength("done: failure", request.failure(), kMaxErrorBytes));
  const std::string not_in_job =
      absl::StrCat("done from worker ", request.worker_id(), ", which is not in the job (lost, or done before)");
  // Leaving is a membership change: its subscribers (OnMembership among them) take it from here.
  if (!request.failure().empty() && !parts_.clocks->stopped()) {
    if (request.program_error() && parts_.job->cluster().worker_errors() == tessera::v1::ClusterSpec::FAIL_JOB) {
      // A bug in the training program: the job fails now (cluster.worker_errors), before the worker leaves, so
      // that its leaving finds the job stopped and ends it.
      if (parts_.view->Workers()[request.worker_id()].state != MemberState::kAlive) {
        return absl::FailedPreconditionError(not_in_job);
      }
      Fail(absl::StrCat("worker ", request.worker_id(), " failed at clock ", request.clock(), ": ",
                        request.failure(), " (an error of its training program: cluster.worker_errors is FAIL_JOB)"));
    }
    if (!parts_.view->Leave(request.worker_id(), MemberState::kLost, request.failure())) {
      return absl::FailedPreconditionError(not_in_job);
    }
    return absl::OkStatus();
  }
  if (!request.failure().empty()) {
    // The job had stopped (complete, failed or asked to): a worker whose last calls failed then (to a server that
    // is gone or frozen) stopped because the job did. It is done, not lost; its error goes into the events, before
    // it leaves (its leaving may end the job and write the summary).
    if (parts_.view->Workers()[request.worker_id()].state != MemberState::kAlive) {
      return absl::FailedPreconditionError(not_in_job);
    }
    LOG(INFO) << "worker " << request.worker_id() << " stopped with the job at clock " << request.clock() << ": "
              << request.failure();
    parts_.records->AddEvent({{"event", "worker stopped with the job"},
                              {"worker", request.worker_id()},
                              {"clock", request.clock()},
                              {"error", request.failure()}});
    if (!parts_.view->Leave(request.worker_id(), MemberState::kDone)) return absl::FailedPreconditionError(not_in_job);
    return absl::OkStatus();
  }
  if (!parts_.view->Leave(request.worker_id(), MemberState::kDone)) return absl::FailedPreconditionError(not_in_job);
  LOG(INFO) << "worker " << request.worker_id() << " done at clock " << request.clock();
  return absl::OkStatus();
}

void JobEnd::NoteWorkerLost(const Member& m, const std::string& failure) {
  const int64_t clock = parts_.clocks->Clocks()[m.id];
  LOG(WARNING) << (failure.empty() ? absl::StrCat(m.Describe(), " lost: no heartbeat for ",
                                                  absl::FormatDuration(heartbeat_timeout_), " at clock ",
                                                  clock)
                                   : absl::StrCat(m.Describe(), " failed at clock ", clock, ": ", failure))
               << (parts_.clocks->stopped() ? "" : "; the others go on without it (it may rejoin)");
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
}

void JobEnd::Fail(const std::string& reason) {
  if (Completed()) {
    // The workers may still be finishing (a last evaluation): the job's end is theirs, and its verdict stands.
    LOG(WARNING) << reason << " (after the job completed: not a failure)";
    parts_.records->AddEvent({{"event", "loss after the job completed"}, {"error", reason}});
    return;
  }
  LOG(ERROR) << reason;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) failure_ = reason;
  }
  StopClocks(reason);
}

void JobEnd::StopClocks(const std::string& why) {
  parts_.clocks->Stop(why);
  parts_.servers->EndViewChanges();  // a stopped job hands no view over: none may hold its end back
}

void JobEnd::StopCompleted(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty()) completed_ = true;
  }
  StopClocks(why);
}

bool JobEnd::Completed() {
  {
    absl::MutexLock lock(&mu_);
    if (completed_ || !failure_.empty()) return completed_;
  }
  // Read before mu_ is taken again (the view and the clock table have locks of their own).
  const int64_t last_step = parts_.job->stop().max_steps();
  const std::vector<int64_t> clocks = parts_.clocks->Clocks();
  bool ran_its_course = false, still_training = false;
  for (const Member& w : parts_.view->Workers()) {
    const bool at_end = w.state == MemberState::kDone ||
                        (w.state == MemberState::kAlive && last_step > 0 && clocks[w.id] >= last_step);
    ran_its_course |= at_end;
    still_training |= !at_end && w.state != MemberState::kLost;
  }
  absl::MutexLock lock(&mu_);
  if (failure_.empty() && ran_its_course && !still_training) completed_ = true;
  return completed_;
}

void JobEnd::Abort(const std::string& reason) {
  const bool completed = Completed();
  {
    absl::MutexLock lock(&mu_);
    if (failure_.empty() && !finishing_ && !completed) failure_ = reason;
  }
  StopClocks(reason);
}

void JobEnd::EndAStopNobodyFinishes() {
  if (!parts_.clocks->stopped()) return;
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
    if (now - stopped_at < (failure_.empty() ? 2 : 1) * heartbeat_timeout_) return;
    finishing_ = true;
  }
  std::vector<std::string> running;
  for (const Member& w : parts_.view->Workers()) {
    if (w.state == MemberState::kAlive) running.push_back(absl::StrCat("worker ", w.id));
  }
  LOG(WARNING) << "the job stopped (" << parts_.clocks->stop_reason() << ") " << absl::FormatDuration(now - stopped_at)
               << " ago and " << absl::StrJoin(running, ", ") << " did not finish: ending it without them";
  parts_.executor->Submit([this] { Finish(); });
}

void JobEnd::FinishNow() {
  {
    absl::MutexLock lock(&mu_);
    if (!finishing_) {
      finishing_ = true;
      // On the executor, like every end of the job: never beside a recovery or a view change it runs.
      parts_.executor->Submit([this] { Finish(); });
    }
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&finished_));
}

void JobEnd::MaybeFinish() {
  bool any_alive = false, any_vacant = false, any_done = false;
  for (const Member& w : parts_.view->Workers()) {
    any_alive |= w.state == MemberState::kAlive;
    any_vacant |= w.state == MemberState::kVacant;
    any_done |= w.state == MemberState::kDone;
  }
  // A job that completed (its target reached, say) stays so when its workers are lost after that.
  const bool completed = Completed();
  absl::MutexLock lock(&mu_);
  // Ranks nobody holds yet hold the end back until the job is stopped (stop.max_seconds included).
  const bool stopped = parts_.clocks->stopped();
  if (any_alive || (any_vacant && !stopped) || finishing_) return;
  if (!any_done && failure_.empty() && !completed && !any_vacant) {
    // A worker that stopped on an error may be started again (a launcher's restart, a pod's): the job waits for
    // it as long as for one that fell silent. The ticker asks again.
    if (absl::Now() < last_failure_report_ + heartbeat_timeout_) return;
    std::vector<std::string> lost;
    const std::vector<int64_t> clocks = parts_.clocks->Clocks();
    for (const Member& w : parts_.view->Workers()) {
      lost.push_back(absl::StrCat("worker ", w.id, " at clock ", clocks[w.id]));
      if (auto failed = worker_failures_.find(w.id); failed != worker_failures_.end()) {
        absl::StrAppend(&lost.back(), ", which failed: ", failed->second);
      }
    }
    // Errors may hold commas: the workers are parted by semicolons when any failed.
    failure_ = absl::StrCat("every worker was lost (", absl::StrJoin(lost, worker_failures_.empty() ? ", " : "; "), ")");
  }
  finishing_ = true;
  parts_.executor->Submit([this] { Finish(); });
}

void JobEnd::Finish() {
  std::optional<tessera::v1::ShardMap> map = parts_.view->Map();
  if (map) parts_.records->UpdateServerStats(parts_.servers->Stats(*map));
  JobOutcome outcome;
  std::vector<int> lost;
  {
    absl::MutexLock lock(&mu_);
    lost = lost_workers_;
    outcome.completed = failure_.empty();
    outcome.stop_reason = failure_;
  }
  if (outcome.stop_reason.empty()) {
    outcome.stop_reason = parts_.clocks->stop_reason();
    if (outcome.stop_reason.empty()) {
      outcome.stop_reason = "every worker reached its last step (stop.max_steps / stop.epochs)";
    }
  }
  // Steps: the clocks of the workers that stayed in the job (or of all, when every one was lost).
  const std::vector<int64_t> clocks = parts_.clocks->Clocks();
  std::vector<int64_t> stayed;
  for (const Member& w : parts_.view->Workers()) {
    if (w.state != MemberState::kLost) stayed.push_back(clocks[w.id]);
  }
  nlohmann::json summary = parts_.records->SaveSummary(outcome, clocks, stayed.empty() ? clocks : stayed, lost,
                                                {{"balance", parts_.balancer->ToJson()},
                                                 {"rounds", parts_.pages->RoundsJson()},
                                                 {"checkpoints", parts_.pages->CheckpointsJson()}});
  {
    absl::MutexLock lock(&mu_);
    summary_ = summary;
    finished_ = true;
  }
  // The printed line is what a launcher or a log reader takes for the job's end: /status agrees from here on.
  parts_.records->PrintSummary(summary);
  if (map) {
    if (absl::Status s = parts_.servers->Shutdown(*map); !s.ok()) LOG(WARNING) << s;
  }
  on_finished_(outcome);
}

bool JobEnd::FailureReportPending() const {
  absl::MutexLock lock(&mu_);
  return last_failure_report_ != absl::InfinitePast() && !finishing_;
}

bool JobEnd::finishing() const {
  absl::MutexLock lock(&mu_);
  return finishing_;
}

nlohmann::json JobEnd::summary() const {
  absl::MutexLock lock(&mu_);
  return summary_;
}

bool JobEnd::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

}  // namespace tessera

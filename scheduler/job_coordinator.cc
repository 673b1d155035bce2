#include "scheduler/job_coordinator.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/http_endpoint.h"
#include "common/job_spec.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace tessera {

using tessera::v1::ConsistencySpec;

namespace {
int GateBound(const ConsistencySpec& c) {
  switch (c.mode()) {
    case ConsistencySpec::ASYNC:
      return -1;
    case ConsistencySpec::SSP:
      return c.staleness();
    default:
      return 0;
  }
}
}  // namespace

absl::StatusOr<std::unique_ptr<JobCoordinator>> JobCoordinator::Create(tessera::v1::JobSpec job,
                                                                       const std::string& run_dir,
                                                                       absl::Duration heartbeat_interval,
                                                                       ServerControl* servers,
                                                                       std::function<void()> on_finished) {
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RunRecorder> recorder, RunRecorder::Create(run_dir));
  return std::unique_ptr<JobCoordinator>(
      new JobCoordinator(std::move(job), std::move(recorder), heartbeat_interval, servers, std::move(on_finished)));
}

JobCoordinator::JobCoordinator(tessera::v1::JobSpec job, std::unique_ptr<RunRecorder> recorder,
                               absl::Duration heartbeat_interval, ServerControl* servers,
                               std::function<void()> on_finished)
    : job_(std::move(job)),
      recorder_(std::move(recorder)),
      heartbeat_interval_(heartbeat_interval),
      servers_(servers),
      on_finished_(std::move(on_finished)),
      start_(absl::Now()),
      membership_(job_.cluster().num_servers(), job_.cluster().num_workers()),
      next_waiting_report_(start_ + kWaitingReportInterval),
      clocks_(job_.cluster().num_workers(), GateBound(job_.consistency())),
      last_report_(job_.cluster().num_workers()),
      done_(job_.cluster().num_workers(), false) {}

JobCoordinator::~JobCoordinator() = default;

absl::StatusOr<tessera::v1::RegisterResponse> JobCoordinator::Register(const tessera::v1::RegisterRequest& request) {
  TESSERA_ASSIGN_OR_RETURN(int id, membership_.Add(request, absl::Now()));
  LOG(INFO) << tessera::v1::Role_Name(request.role()) << " " << id << " registered from "
            << (request.address().empty() ? request.hostname() : request.address())
            << (request.device().empty() ? "" : " on " + request.device());
  tessera::v1::RegisterResponse response;
  response.set_id(id);
  *response.mutable_job() = job_;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  return response;
}

absl::StatusOr<tessera::v1::HeartbeatResponse> JobCoordinator::Heartbeat(
    const tessera::v1::HeartbeatRequest& request) {
  TESSERA_RETURN_IF_ERROR(membership_.Touch(request.role(), request.id(), absl::Now()));
  tessera::v1::HeartbeatResponse response;
  response.set_job_finished(finished());
  return response;
}

void JobCoordinator::Declare(const tessera::v1::DeclareRequest& request,
                             std::function<void(absl::StatusOr<tessera::v1::ShardMap>)> done) {
  executor_.Submit([this, request, done = std::move(done)] {
    if (!membership_.AllServersRegistered()) {
      done(absl::UnavailableError(absl::StrCat("waiting for servers: ", membership_.Servers().size(), " of ",
                                               membership_.num_servers(), " registered")));
      return;
    }
    tessera::v1::ShardMap map;
    {
      absl::MutexLock lock(&mu_);
      if (map_) {
        map = *map_;
      } else {
        for (const Member& s : membership_.Servers()) {
          auto* info = map.add_servers();
          info->set_id(s.id);
          info->set_address(s.address);
        }
      }
    }
    const uint64_t before = map.epoch();
    if (absl::Status placed = PlaceParameters({request.params().begin(), request.params().end()}, job_.chunk_bytes(), map); !placed.ok()) {
      done(placed);
      return;
    }
    if (map.epoch() != before) {
      if (absl::Status assigned = servers_->Assign(map, job_); !assigned.ok()) {
        done(Annotate(assigned, "cannot hand shards to the servers"));
        return;
      }
      LOG(INFO) << "shard map epoch " << map.epoch() << ": " << map.params_size() << " parameters in "
                << map.chunks_size() << " chunks on " << map.servers_size() << " servers";
      absl::MutexLock lock(&mu_);
      map_ = map;
    }
    done(map);
  });
}

absl::StatusOr<tessera::v1::ShardMap> JobCoordinator::GetShardMap() const {
  absl::MutexLock lock(&mu_);
  if (!map_) return absl::FailedPreconditionError("no parameters have been declared yet");
  return *map_;
}

void JobCoordinator::AdvanceClock(const tessera::v1::AdvanceClockRequest& request, ClockTable::Callback done) {
  const absl::Duration wait =
      request.wait_timeout_ms() > 0 ? absl::Milliseconds(request.wait_timeout_ms()) : absl::Minutes(5);
  clocks_.Advance(request.worker_id(), request.clock(), absl::Now() + wait, std::move(done));
}

absl::StatusOr<tessera::v1::ReportResponse> JobCoordinator::Report(const tessera::v1::ReportRequest& request) {
  if (request.worker_id() < 0 || request.worker_id() >= job_.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("report from unknown worker ", request.worker_id()));
  }
  if (!request.device().empty()) membership_.SetWorkerDevice(request.worker_id(), request.device());
  {
    absl::MutexLock lock(&mu_);
    last_report_[request.worker_id()] = request;
    if (!request.has_eval()) return StopResponse();
    last_eval_ = request;
    const float target = job_.stop().target_accuracy();
    if (target > 0 && request.test_accuracy() >= target && !seconds_to_target_) {
      seconds_to_target_ = absl::ToDoubleSeconds(absl::Now() - start_);
    }
  }
  const float target = job_.stop().target_accuracy();
  if (target > 0 && request.test_accuracy() >= target) {
    clocks_.Stop(absl::StrCat("test accuracy ", request.test_accuracy(), " reached the target ", target));
  }
  executor_.Submit([this, request] { WriteEvalRecord(request); });
  return StopResponse();
}

tessera::v1::ReportResponse JobCoordinator::StopResponse() const {
  tessera::v1::ReportResponse response;
  response.set_stop(clocks_.stopped());
  if (response.stop()) response.set_stop_reason(clocks_.stop_reason());
  return response;
}

void JobCoordinator::WriteEvalRecord(const tessera::v1::ReportRequest& eval) {
  EvalRecord record;
  record.step = eval.clock();
  record.epoch = eval.epoch();
  record.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
  record.test_loss = eval.test_loss();
  record.test_accuracy = eval.test_accuracy();
  {
    absl::MutexLock lock(&mu_);
    int reporting = 0;
    for (const auto& r : last_report_) {
      if (r.samples() == 0) continue;
      record.samples_per_sec += r.samples_per_sec();
      record.train_loss += r.train_loss();
      ++reporting;
    }
    if (reporting > 0) record.train_loss /= reporting;
  }
  std::optional<tessera::v1::ShardMap> map;
  {
    absl::MutexLock lock(&mu_);
    map = map_;
  }
  if (map) {
    absl::StatusOr<std::vector<tessera::v1::ServerStats>> stats = servers_->Stats(*map);
    if (stats.ok()) {
      ClusterStats sum = ClusterStats::Sum(*stats);
      record.max_staleness = sum.staleness.max();
      record.updates_applied = sum.model_updates();
      absl::MutexLock lock(&mu_);
      staleness_ = sum.staleness.ToProto();
    } else {
      LOG(WARNING) << "no server statistics for the progress record: " << stats.status();
    }
  }
  {
    absl::MutexLock lock(&mu_);
    history_.push_back(record);
  }
  if (absl::Status s = recorder_->Append(record); !s.ok()) LOG(ERROR) << s;
}

absl::Status JobCoordinator::Done(const tessera::v1::DoneRequest& request) {
  if (request.worker_id() < 0 || request.worker_id() >= job_.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("done from unknown worker ", request.worker_id()));
  }
  clocks_.Done(request.worker_id());
  LOG(INFO) << "worker " << request.worker_id() << " done at clock " << request.clock();
  absl::MutexLock lock(&mu_);
  MarkDoneLocked(request.worker_id());
  return absl::OkStatus();
}

void JobCoordinator::MarkDoneLocked(int worker) {
  done_[worker] = true;
  if (finishing_ || std::find(done_.begin(), done_.end(), false) != done_.end()) return;
  finishing_ = true;
  executor_.Submit([this] { FinishJob(); });
}

void JobCoordinator::CheckLiveness(absl::Time now, absl::Duration timeout) {
  // Until every member has registered, say whom the job waits for, every kWaitingReportInterval.
  if (now >= next_waiting_report_) {
    const std::string waiting = membership_.WaitingSummary(now, timeout);
    if (!waiting.empty()) {
      LOG(INFO) << waiting;
      next_waiting_report_ = now + kWaitingReportInterval;
    }
  }
  for (int worker : membership_.SilentWorkers(now, timeout)) {
    {
      absl::MutexLock lock(&mu_);
      if (done_[worker]) continue;
      lost_.push_back(worker);
    }
    const std::string reason =
        absl::StrCat("worker ", worker, " lost: no heartbeat for ", absl::FormatDuration(timeout));
    LOG(WARNING) << reason << (job_.consistency().mode() == ConsistencySpec::SYNC
                                   ? "; a sync round needs every worker, so the job stops"
                                   : "; the others go on without it");
    // Stop first: a sync worker released by the Done below must learn that the job is over.
    if (job_.consistency().mode() == ConsistencySpec::SYNC) clocks_.Stop(reason);
    clocks_.Done(worker);
    absl::MutexLock lock(&mu_);
    MarkDoneLocked(worker);
  }
}

void JobCoordinator::FinishJob() {
  std::optional<tessera::v1::ShardMap> map;
  {
    absl::MutexLock lock(&mu_);
    map = map_;
  }
  ClusterStats sum;
  if (map) {
    absl::StatusOr<std::vector<tessera::v1::ServerStats>> stats = servers_->Stats(*map);
    if (stats.ok()) {
      sum = ClusterStats::Sum(*stats);
    } else {
      LOG(ERROR) << "final server statistics unavailable: " << stats.status();
    }
  }
  const std::vector<int64_t> clocks = clocks_.Clocks();
  nlohmann::json summary;
  {
    absl::MutexLock lock(&mu_);
    RunSummary common;
    common.job = job_.name();
    common.mode = ModeName(job_.consistency());
    common.servers = job_.cluster().num_servers();
    common.workers = job_.cluster().num_workers();
    // Clocks every worker completed (one may have started a step the stop cut short).
    common.steps = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
    common.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    if (last_eval_) common.SetLastEval(last_eval_->epoch(), last_eval_->test_accuracy(), last_eval_->test_loss());
    common.target_accuracy = job_.stop().target_accuracy();
    common.seconds_to_target = seconds_to_target_;
    common.updates_applied = sum.model_updates();
    common.max_staleness = sum.staleness.max();
    summary = common.ToJson();
    summary["worker_clocks"] = clocks;
    summary["lost_workers"] = lost_;
    const std::string stopped_by = clocks_.stop_reason();
    summary["stop_reason"] =
        stopped_by.empty() ? absl::StrCat("every worker reached its last step (stop.max_steps / stop.epochs)")
                           : stopped_by;
    summary["chunk_updates_applied"] = sum.chunk_updates;
    summary["pushes"] = sum.pushes;
    summary["duplicate_pushes"] = sum.duplicate_pushes;
    summary["late_pushes"] = sum.late_pushes;
    const tessera::v1::StalenessHistogram histogram = sum.staleness.ToProto();
    summary["staleness_histogram"] = std::vector<int64_t>(histogram.bucket().begin(), histogram.bucket().end());
  }
  if (absl::Status s = recorder_->WriteSummary(summary); !s.ok()) LOG(ERROR) << s;
  {
    absl::MutexLock lock(&mu_);
    summary_ = summary;
    finished_ = true;
  }
  if (map) {
    if (absl::Status s = servers_->Shutdown(*map); !s.ok()) LOG(WARNING) << s;
  }
  on_finished_();
}

nlohmann::json JobCoordinator::StatusJson() const {
  nlohmann::json status;
  status["job"] = job_.name();
  status["mode"] = ModeName(job_.consistency());
  status["uptime_seconds"] = absl::ToDoubleSeconds(absl::Now() - start_);
  status["clocks"] = clocks_.Clocks();
  status["stopped"] = clocks_.stopped();
  const absl::Time now = absl::Now();
  auto members = [&](const std::vector<Member>& list) {
    nlohmann::json out = nlohmann::json::array();
    for (const Member& m : list) {
      out.push_back({{"id", m.id},
                     {"address", m.address},
                     {"hostname", m.hostname},
                     {"device", m.device},
                     {"seconds_since_heartbeat", absl::ToDoubleSeconds(now - m.last_seen)}});
    }
    return out;
  };
  status["servers"] = members(membership_.Servers());
  status["workers"] = members(membership_.Workers());
  absl::MutexLock lock(&mu_);
  status["shard_map_epoch"] = map_ ? map_->epoch() : 0;
  status["finished"] = finished_;
  nlohmann::json history = nlohmann::json::array();
  for (const EvalRecord& r : history_) {
    history.push_back({{"step", r.step},
                       {"wall_seconds", r.wall_seconds},
                       {"train_loss", r.train_loss},
                       {"test_accuracy", r.test_accuracy},
                       {"samples_per_sec", r.samples_per_sec},
                       {"max_staleness", r.max_staleness}});
  }
  status["history"] = std::move(history);
  status["staleness_histogram"] = std::vector<int64_t>(staleness_.bucket().begin(), staleness_.bucket().end());
  if (last_eval_) {
    status["last_eval"] = {{"step", last_eval_->clock()},
                           {"test_accuracy", last_eval_->test_accuracy()},
                           {"test_loss", last_eval_->test_loss()}};
  }
  return status;
}

std::string JobCoordinator::MetricsText() const {
  std::string text = PrometheusMetric("tessera_scheduler_servers", "gauge", membership_.Servers().size()) +
                     PrometheusMetric("tessera_scheduler_workers", "gauge", membership_.Workers().size());
  text += "# TYPE tessera_scheduler_worker_clock gauge\n";
  const std::vector<int64_t> clocks = clocks_.Clocks();
  for (size_t i = 0; i < clocks.size(); ++i) {
    absl::StrAppend(&text, "tessera_scheduler_worker_clock{worker=\"", i, "\"} ", clocks[i], "\n");
  }
  absl::MutexLock lock(&mu_);
  text += PrometheusMetric("tessera_scheduler_job_finished", "gauge", finished_ ? 1 : 0);
  if (last_eval_) text += PrometheusMetric("tessera_scheduler_test_accuracy", "gauge", last_eval_->test_accuracy());
  return text;
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

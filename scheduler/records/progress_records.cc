#include "scheduler/records/progress_records.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/daemon/http_endpoint.h"
#include "common/model/job_spec.h"
#include "glog/logging.h"

namespace tessera {

ProgressRecords::ProgressRecords(const tessera::v1::JobSpec& job, std::unique_ptr<RunRecorder> recorder,
                                 absl::Time start)
    : job_(job), recorder_(std::move(recorder)), start_(start), last_report_(job.cluster().num_workers()) {}

ProgressRecords::Taken ProgressRecords::AddReport(const tessera::v1::ReportRequest& report) {
  absl::MutexLock lock(&mu_);
  last_report_[report.worker_id()] = report;
  if (!report.has_eval()) return {};
  // One evaluation per clock at most: one of values no newer than the last taken adds nothing.
  const int64_t clock = report.eval_clock() > 0 ? report.eval_clock() : report.clock();
  if (last_eval_ && clock <= last_eval_->clock()) return {};
  last_eval_ = report;
  if (report.eval_clock() > 0) last_eval_->set_clock(report.eval_clock());  // the clock of the values scored
  std::string reached = TargetReachedReason(job_, report.test_accuracy());
  if (!reached.empty() && !seconds_to_target_) seconds_to_target_ = absl::ToDoubleSeconds(absl::Now() - start_);
  return {true, std::move(reached)};
}

nlohmann::json ProgressRecords::StalenessJson(const ClusterStats& sum) {
  nlohmann::json workers = nlohmann::json::array();
  for (const StalenessHistogram& h : sum.worker_staleness) workers.push_back(h.ToJson());
  return {{"all", sum.staleness.ToJson()}, {"workers", workers}};
}

void ProgressRecords::UpdateServerStats(const std::vector<ServerStatsAnswer>& answers) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : server_stats_) entry.live = false;
  for (const ServerStatsAnswer& a : answers) {
    Entry& entry = server_stats_[{a.server_id, a.incarnation}];
    entry.live = true;
    if (a.stats.ok()) {
      entry.stats = *a.stats;
    } else {
      LOG(WARNING) << "server statistics: " << a.stats.status() << "; keeping its last figures";
    }
  }
}

ClusterStats ProgressRecords::ServerTotals() const {
  absl::MutexLock lock(&mu_);
  ClusterStats sum;
  for (const auto& [key, entry] : server_stats_) {
    const tessera::v1::ServerStats& s = entry.stats;
    if (entry.live) {
      sum.chunks += s.chunks();
      sum.chunk_updates += s.updates_applied();
    }
    sum.pushes += s.pushes();
    sum.duplicate_pushes += s.duplicate_pushes();
    sum.late_pushes += s.late_pushes();
    sum.push_bytes += s.push_bytes();
    sum.replica_bytes += s.replica_bytes_sent();
    sum.compensated_pushes += s.compensated_pushes();
    sum.compensated_grad_sq += s.compensated_grad_sq();
    sum.compensation_sq += s.compensation_sq();
    sum.staleness.Merge(s.staleness());
    if (sum.worker_staleness.size() < static_cast<size_t>(s.worker_staleness_size())) {
      sum.worker_staleness.resize(s.worker_staleness_size());
    }
    for (int w = 0; w < s.worker_staleness_size(); ++w) sum.worker_staleness[w].Merge(s.worker_staleness(w));
  }
  return sum;
}

nlohmann::json ProgressRecords::TablesJson() const {
  absl::MutexLock lock(&mu_);
  nlohmann::json tables = nlohmann::json::object();
  std::map<std::string, StalenessHistogram> staleness;
  for (const auto& [key, entry] : server_stats_) {
    for (const tessera::v1::TableStats& t : entry.stats.tables()) {
      nlohmann::json& j = tables[t.table()];
      if (j.is_null()) {
        j = {{"rows", 0}, {"memory_bytes", 0}, {"rows_by_server", nlohmann::json::object()}, {"rows_updated", 0},
             {"rows_created", 0}, {"rows_expired", 0}, {"rows_evicted", 0}, {"admission_refusals", 0}};
      }
      if (entry.live) {
        j["rows"] = j["rows"].get<int64_t>() + t.rows();
        j["memory_bytes"] = j["memory_bytes"].get<int64_t>() + t.memory_bytes();
        j["rows_by_server"][std::to_string(key.first)] = t.rows();
      }
      using Counter = int64_t (tessera::v1::TableStats::*)() const;
      for (auto [name, counter] : {std::pair<const char*, Counter>{"rows_updated", &tessera::v1::TableStats::rows_updated},
                                   {"rows_created", &tessera::v1::TableStats::rows_created},
                                   {"rows_expired", &tessera::v1::TableStats::rows_expired},
                                   {"rows_evicted", &tessera::v1::TableStats::rows_evicted},
                                   {"admission_refusals", &tessera::v1::TableStats::admission_refusals}}) {
        j[name] = j[name].get<int64_t>() + (t.*counter)();
      }
      staleness[t.table()].Merge(t.staleness());
    }
  }
  for (auto& [name, histogram] : staleness) tables[name]["staleness"] = histogram.ToJson();
  return tables;
}

void ProgressRecords::NoteClock(int worker, int64_t clock) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  training_.Note(clock, now);
  if (worker < 0 || worker >= job_.cluster().num_workers()) return;
  step_times_.resize(job_.cluster().num_workers());
  std::map<int64_t, absl::Time>& times = step_times_[worker];
  times.emplace(clock, now);
  while (times.size() > kStepTimesKept) times.erase(times.begin());
  stepped_.resize(job_.cluster().num_workers());
  if (stepped_[worker]) return;
  stepped_[worker] = true;
  // For launchers (tessera-launch sets a worker's CPU quota here: its start-up and data loading ran at the
  // machine's speed).
  recorder_->PrintLine(absl::StrCat("worker ", worker, kFirstStepSuffix));
  if (std::all_of(stepped_.begin(), stepped_.end(), [](bool b) { return b; })) every_worker_stepped_ = now;
}

void ProgressRecords::WriteEvalRecord(const tessera::v1::ReportRequest& eval) {
  EvalRecord record;
  record.step = eval.eval_clock() > 0 ? eval.eval_clock() : eval.clock();
  record.epoch = eval.epoch();
  record.wall_seconds = absl::ToDoubleSeconds(absl::Now() - run_start());
  {
    absl::MutexLock lock(&mu_);
    const int w = eval.worker_id();
    if (w >= 0 && w < static_cast<int>(step_times_.size())) {
      auto it = step_times_[w].find(record.step);
      if (it != step_times_[w].end()) record.clock_wall_seconds = absl::ToDoubleSeconds(it->second - start_);
    }
  }
  record.test_loss = eval.test_loss();
  record.test_accuracy = eval.test_accuracy();
  const ClusterStats sum = ServerTotals();
  record.max_staleness = sum.staleness.max();
  record.updates_applied = sum.model_updates();
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
    history_.push_back(record);
    if (history_.size() > kHistoryLimit) history_.pop_front();
  }
  if (absl::Status s = recorder_->Append(record); !s.ok()) LOG(ERROR) << s;
}

void ProgressRecords::OnMembership(const MembershipEvent& event, int64_t worker_clock) {
  const Member& m = event.member;
  switch (event.kind) {
    case MembershipEvent::kWorkerLost: {
      nlohmann::json entry = {{"event", event.failure.empty() ? "worker lost" : "worker failed"},
                              {"worker", m.id},
                              {"incarnation", m.incarnation},
                              {"clock", worker_clock}};
      if (!event.failure.empty()) entry["error"] = event.failure;
      AddEvent(std::move(entry));
      break;
    }
    case MembershipEvent::kWorkerJoined:
      // tessera-launch learns from this line that the rank joined (deploy/launcher/launcher.cc: a rank whose command
      // exits before it joined can never join, and the launcher ends the run).
      recorder_->PrintLine(absl::StrCat("worker ", m.id, " joined the job"));
      break;
    case MembershipEvent::kWorkerRejoined:
      AddEvent({{"event", "worker rejoined"}, {"worker", m.id}, {"incarnation", m.incarnation},
                {"clock", m.joined_clock}});
      break;
    case MembershipEvent::kServerLost:
    case MembershipEvent::kServerReplaced:
      AddEvent({{"event", MembershipEventName(event.kind)}, {"server", m.id}, {"incarnation", m.incarnation},
                {"address", m.address}});
      break;
    default:
      break;
  }
}

void ProgressRecords::AddEvent(nlohmann::json event) {
  const absl::Time now = absl::Now();
  event["wall_seconds"] = absl::ToDoubleSeconds(now - run_start());
  event["unix_seconds"] = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  recorder_->AppendEvent(event);
  absl::MutexLock lock(&mu_);
  events_.push_back(std::move(event));
  if (events_.size() > kEventLimit) events_.erase(events_.begin());
}

absl::Time ProgressRecords::run_start() const {
  absl::MutexLock lock(&mu_);
  return start_;
}

absl::Status ProgressRecords::StartAfresh() {
  {
    absl::MutexLock lock(&mu_);
    events_ = nlohmann::json::array();
    start_ = absl::Now();
  }
  return recorder_->StartAfresh();
}

void ProgressRecords::TakeBackEvents(std::vector<nlohmann::json> earlier) {
  absl::MutexLock lock(&mu_);
  if (!earlier.empty() && earlier[0].contains("unix_seconds") && earlier[0].contains("wall_seconds")) {
    start_ = std::min(start_, absl::UnixEpoch() + absl::Seconds(earlier[0]["unix_seconds"].get<double>() -
                                                                earlier[0]["wall_seconds"].get<double>()));
  }
  nlohmann::json events = nlohmann::json::array();
  for (nlohmann::json& e : earlier) events.push_back(std::move(e));
  for (nlohmann::json& e : events_) events.push_back(std::move(e));
  while (events.size() > kEventLimit) events.erase(events.begin());
  events_ = std::move(events);
}

nlohmann::json ProgressRecords::SaveSummary(const JobOutcome& outcome, const std::vector<int64_t>& worker_clocks,
                                            const std::vector<int64_t>& counted_clocks,
                                            const std::vector<int>& lost_workers, const nlohmann::json& extra) {
  const ClusterStats sum = ServerTotals();
  nlohmann::json summary;
  {
    absl::MutexLock lock(&mu_);
    RunSummary common;
    common.job = job_.name();
    common.mode = ModeName(job_.consistency());
    common.servers = job_.cluster().num_servers();
    common.workers = job_.cluster().num_workers();
    // Clocks every worker that stayed completed (one may have started a step the stop cut short).
    common.steps = counted_clocks.empty() ? 0 : *std::min_element(counted_clocks.begin(), counted_clocks.end());
    common.wall_seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    if (last_eval_) common.SetLastEval(last_eval_->epoch(), last_eval_->test_accuracy(), last_eval_->test_loss());
    common.target_accuracy = job_.stop().target_accuracy();
    common.seconds_to_target = seconds_to_target_;
    common.updates_applied = sum.model_updates();
    common.max_staleness = sum.staleness.max();
    summary = common.ToJson();
    summary["completed"] = outcome.completed;
    summary["stop_reason"] = outcome.stop_reason;
    summary["worker_clocks"] = worker_clocks;
    summary["lost_workers"] = lost_workers;
    summary["last_eval_step"] = last_eval_ ? nlohmann::json(last_eval_->clock()) : nlohmann::json();
    summary["events"] = events_;
    summary["chunk_updates_applied"] = sum.chunk_updates;
    summary["pushes"] = sum.pushes;
    summary["duplicate_pushes"] = sum.duplicate_pushes;
    summary["late_pushes"] = sum.late_pushes;
    summary["push_bytes"] = sum.push_bytes;
    summary["replica_bytes"] = sum.replica_bytes;
    if (sum.compensated_pushes > 0) {
      // How much delay compensation changed the gradients it corrected: |correction| / |gradient| over them all.
      summary["delay_compensation"] = {
          {"pushes", sum.compensated_pushes},
          {"relative_correction", sum.compensated_grad_sq > 0 ? std::sqrt(sum.compensation_sq / sum.compensated_grad_sq) : 0.0}};
    }
    summary["training"] = training_.ToJson(start_);
    if (every_worker_stepped_ && summary["training"].is_object()) {
      summary["training"]["every_worker_stepped_wall_seconds"] = absl::ToDoubleSeconds(*every_worker_stepped_ - start_);
    }
    const tessera::v1::StalenessHistogram histogram = sum.staleness.ToProto();
    summary["staleness_histogram"] = std::vector<int64_t>(histogram.bucket().begin(), histogram.bucket().end());
    summary["staleness"] = StalenessJson(sum);
    summary.update(extra);
  }
  const nlohmann::json tables = TablesJson();
  if (!tables.empty()) summary["tables"] = tables;
  if (absl::Status s = recorder_->SaveSummary(summary); !s.ok()) LOG(ERROR) << s;
  return summary;
}

void ProgressRecords::AddToStatus(nlohmann::json& status) const {
  const ClusterStats sum = ServerTotals();
  status["staleness"] = StalenessJson(sum);
  status["staleness_histogram"] = [&] {
    const tessera::v1::StalenessHistogram h = sum.staleness.ToProto();
    return std::vector<int64_t>(h.bucket().begin(), h.bucket().end());
  }();
  absl::MutexLock lock(&mu_);
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
  status["events"] = events_;
  if (last_eval_) {
    status["last_eval"] = {{"step", last_eval_->clock()},
                           {"test_accuracy", last_eval_->test_accuracy()},
                           {"test_loss", last_eval_->test_loss()}};
  }
}

void ProgressRecords::AddMetrics(MetricsPage& page) const {
  absl::MutexLock lock(&mu_);
  if (!last_eval_) return;
  page.Family("tessera_scheduler_test_accuracy", MetricsPage::kGauge,
              "Test accuracy (0..1) of the newest evaluation.")
      .Sample(last_eval_->test_accuracy());
  page.Family("tessera_scheduler_test_loss", MetricsPage::kGauge, "Test loss of the newest evaluation.")
      .Sample(last_eval_->test_loss());
}

}  // namespace tessera

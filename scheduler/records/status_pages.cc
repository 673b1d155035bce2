#include "scheduler/records/status_pages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/daemon/metrics_page.h"

namespace tessera {

StatusPages::StatusPages(const tessera::v1::JobSpec& job, absl::Time start, const ClusterView& view,
                         const ClockTable& clocks, const BatchBalancer& balancer, const ProgressRecords& records,
                         const Checkpointer& checkpointer)
    : job_(job),
      start_(start),
      view_(view),
      clocks_(clocks),
      balancer_(balancer),
      records_(records),
      checkpointer_(checkpointer) {}

nlohmann::json StatusPages::RoundsJson() const {
  constexpr size_t kShown = 10;
  const std::vector<RoundMembers> rounds = clocks_.RecentRounds();
  nlohmann::json recent = nlohmann::json::array();
  for (size_t i = rounds.size() > kShown ? rounds.size() - kShown : 0; i < rounds.size(); ++i) {
    recent.push_back({{"round", rounds[i].round}, {"in", rounds[i].members}, {"late", rounds[i].late}});
  }
  return {{"backup_workers", job_.consistency().backup_workers()},
          {"late_rounds", clocks_.LateRounds()},
          {"recent", recent}};
}

nlohmann::json StatusPages::StatusJson(const nlohmann::json* summary) const {
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
                     {"state", MemberStateName(m.state)},
                     {"incarnation", m.incarnation},
                     {"address", m.address},
                     {"hostname", m.hostname},
                     {"device", m.device},
                     {"seconds_since_heartbeat", absl::ToDoubleSeconds(now - m.last_seen)}});
    }
    return out;
  };
  status["servers"] = members(view_.Servers());
  status["workers"] = members(view_.Workers());
  {
    // Each worker's part of a round and its measured compute throughput.
    const std::vector<int> shares = balancer_.Shares();
    const std::vector<double> rates = balancer_.SamplesPerSecond();
    for (size_t w = 0; w < status["workers"].size() && w < shares.size(); ++w) {
      status["workers"][w]["batch_share"] = shares[w];
      status["workers"][w]["compute_samples_per_sec"] = rates[w];
    }
  }
  status["balance"] = balancer_.ToJson();
  status["rounds"] = RoundsJson();
  status["checkpoints"] = CheckpointsJson();
  {
    const std::vector<int64_t> late = clocks_.LateRounds();
    for (size_t w = 0; w < status["workers"].size() && w < late.size(); ++w) status["workers"][w]["late_rounds"] = late[w];
  }
  status["shard_map_epoch"] = view_.epoch();
  records_.AddToStatus(status);
  status["finished"] = summary != nullptr;
  if (summary != nullptr) {
    status["completed"] = summary->value("completed", false);
    status["stop_reason"] = summary->value("stop_reason", "");
  }
  return status;
}

nlohmann::json StatusPages::CheckpointsJson() const {
  const CheckpointStats stats = checkpointer_.stats();
  nlohmann::json json = {{"enabled", checkpointer_.enabled()},
                         {"taken", stats.taken},
                         {"failed", stats.failed},
                         {"consecutive_failures", stats.consecutive_failures}};
  if (!stats.last_error.empty()) json["last_error"] = stats.last_error;
  if (std::optional<CheckpointInfo> latest = checkpointer_.latest()) {
    json["latest"] = {{"number", latest->number}, {"clock", latest->state.clock()}, {"folder", latest->folder}};
  }
  return json;
}

std::string StatusPages::MetricsText(bool finished) const {
  auto alive = [](const std::vector<Member>& list) {
    return std::count_if(list.begin(), list.end(), [](const Member& m) { return m.state == MemberState::kAlive; });
  };
  MetricsPage page;
  page.Family("tessera_scheduler_servers", MetricsPage::kGauge, "Servers alive in the job.")
      .Sample(alive(view_.Servers()));
  page.Family("tessera_scheduler_workers", MetricsPage::kGauge, "Workers alive in the job.")
      .Sample(alive(view_.Workers()));
  const CheckpointStats checkpoints = checkpointer_.stats();
  page.Family("tessera_scheduler_checkpoints_total", MetricsPage::kCounter, "Checkpoints taken (complete).")
      .Sample(checkpoints.taken);
  page.Family("tessera_scheduler_checkpoint_failures_total", MetricsPage::kCounter,
              "Checkpoints that failed (their files removed; the previous one stays the latest).")
      .Sample(checkpoints.failed);
  page.Family("tessera_scheduler_checkpoint_consecutive_failures", MetricsPage::kGauge,
              "Checkpoints that failed since the last one taken.")
      .Sample(checkpoints.consecutive_failures);
  page.Family("tessera_scheduler_view_epoch", MetricsPage::kGauge,
              "Epoch of the cluster view (members and placement); it grows at every change.")
      .Sample(view_.epoch());
  auto per_worker = [&page](const auto& values) {
    for (size_t i = 0; i < values.size(); ++i) page.Sample(values[i], {{"worker", absl::StrCat(i)}});
  };
  page.Family("tessera_scheduler_worker_clock", MetricsPage::kGauge, "Each worker's clock (steps completed).");
  per_worker(clocks_.Clocks());
  page.Family("tessera_scheduler_worker_late_rounds_total", MetricsPage::kCounter,
              "Sync rounds that closed without each worker's gradient (backup workers).");
  per_worker(clocks_.LateRounds());
  page.Family("tessera_scheduler_worker_batch_share", MetricsPage::kGauge,
              "Samples of each round's batch given to each worker (batch balancing).");
  per_worker(balancer_.Shares());
  page.Family("tessera_scheduler_job_finished", MetricsPage::kGauge, "1 once the job has ended, else 0.")
      .Sample(finished ? 1 : 0);
  records_.AddMetrics(page);
  return page.text();
}

}  // namespace tessera

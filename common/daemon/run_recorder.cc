#include "common/daemon/run_recorder.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {

bool UnfinishedRun(const std::string& run_dir) {
  if (run_dir.empty()) return false;
  const std::filesystem::path dir(run_dir);
  return std::filesystem::exists(dir / "metrics.jsonl") && !std::filesystem::exists(dir / "summary.json");
}

absl::Status ClaimRunDirectory(const std::string& run_dir, bool overwrite, const std::vector<std::string>& records) {
  if (run_dir.empty()) return absl::OkStatus();
  std::vector<std::string> all = {"summary.json", "metrics.jsonl"};
  all.insert(all.end(), records.begin(), records.end());
  std::vector<std::string> found;
  for (const std::string& name : all) {
    if (std::filesystem::exists(std::filesystem::path(run_dir) / name)) found.push_back(name);
  }
  if (found.empty()) return absl::OkStatus();
  if (!overwrite) {
    return absl::FailedPreconditionError(absl::StrCat("the run directory ", run_dir, " already holds a run (",
                                                      absl::StrJoin(found, ", "),
                                                      "); pick another, or give --overwrite to replace it"));
  }
  const std::filesystem::path aside =
      std::filesystem::path(run_dir) /
      absl::StrCat("replaced-", absl::FormatTime("%Y%m%d-%H%M%E3S", absl::Now(), absl::UTCTimeZone()));
  std::error_code error;
  std::filesystem::create_directories(aside, error);
  for (const std::string& name : found) {
    if (!error) std::filesystem::rename(std::filesystem::path(run_dir) / name, aside / name, error);
  }
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot move the earlier run to ", aside.string(), ": ", error.message()));
  std::cerr << "the earlier run in " << run_dir << " moved to " << aside.string() << std::endl;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RunRecorder>> RunRecorder::Create(const std::string& run_dir, bool append) {
  std::unique_ptr<RunRecorder> recorder(new RunRecorder(run_dir));
  if (run_dir.empty()) return recorder;
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) return absl::PermissionDeniedError("cannot create run directory " + run_dir + ": " + error.message());
  absl::MutexLock lock(&recorder->mu_);
  recorder->metrics_.open(run_dir + "/metrics.jsonl", std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!recorder->metrics_) return absl::PermissionDeniedError("cannot write " + run_dir + "/metrics.jsonl");
  recorder->events_.open(run_dir + "/events.jsonl", std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!recorder->events_) return absl::PermissionDeniedError("cannot write " + run_dir + "/events.jsonl");
  return recorder;
}

absl::Status RunRecorder::StartAfresh() {
  if (run_dir_.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  metrics_.close();
  events_.close();
  absl::Status moved = ClaimRunDirectory(run_dir_, /*overwrite=*/true, {"events.jsonl"});
  const auto mode = std::ios::out | (moved.ok() ? std::ios::trunc : std::ios::app);
  metrics_.open(run_dir_ + "/metrics.jsonl", mode);
  events_.open(run_dir_ + "/events.jsonl", mode);
  if (!metrics_ || !events_) return absl::PermissionDeniedError("cannot write the records in " + run_dir_);
  return moved;
}

void RunRecorder::AppendEvent(const nlohmann::json& event) {
  if (run_dir_.empty()) return;
  absl::MutexLock lock(&mu_);
  events_ << event.dump() << "\n";
  events_.flush();
}

std::vector<nlohmann::json> RunRecorder::ReadEvents(const std::string& run_dir) {
  std::vector<nlohmann::json> events;
  if (run_dir.empty()) return events;
  std::ifstream in(run_dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (event.is_object()) events.push_back(std::move(event));
  }
  return events;
}

absl::Status RunRecorder::Append(const EvalRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"epoch", r.epoch},
                      {"wall_seconds", r.wall_seconds},
                      {"train_loss", r.train_loss},
                      {"test_loss", r.test_loss},
                      {"test_accuracy", r.test_accuracy},
                      {"samples_per_sec", r.samples_per_sec},
                      {"max_staleness", r.max_staleness},
                      {"updates_applied", r.updates_applied}};
  if (r.clock_wall_seconds) j["clock_wall_seconds"] = *r.clock_wall_seconds;
  absl::MutexLock lock(&mu_);
  std::cout << ProgressLine(r) << std::endl;
  if (run_dir_.empty()) return absl::OkStatus();
  metrics_ << j.dump() << "\n";
  metrics_.flush();
  if (!metrics_) return absl::DataLossError("cannot append to " + run_dir_ + "/metrics.jsonl");
  return absl::OkStatus();
}

void TrainingSpan::Note(int64_t clock, absl::Time now) {
  if (first_clock_ < 0) {
    first_ = now;
    first_clock_ = clock;
  }
  last_ = now;
  last_clock_ = std::max(last_clock_, clock);
}

nlohmann::json TrainingSpan::ToJson(std::optional<absl::Time> run_start) const {
  if (first_clock_ < 0) return nullptr;
  nlohmann::json span = {
      {"seconds", absl::ToDoubleSeconds(last_ - first_)}, {"from_clock", first_clock_}, {"to_clock", last_clock_}};
  if (run_start) span["first_step_wall_seconds"] = absl::ToDoubleSeconds(first_ - *run_start);
  return span;
}

absl::Status RunRecorder::WriteSummary(const nlohmann::json& summary) {
  absl::Status saved = SaveSummary(summary);
  PrintSummary(summary);
  return saved;
}

absl::Status RunRecorder::SaveSummary(const nlohmann::json& summary) {
  if (run_dir_.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  const std::string path = run_dir_ + "/summary.json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::out | std::ios::trunc);
    out << summary.dump(2) << "\n";
    if (!out) return absl::DataLossError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::DataLossError("cannot rename " + tmp + " to " + path);
  return absl::OkStatus();
}

void RunRecorder::PrintSummary(const nlohmann::json& summary) {
  absl::MutexLock lock(&mu_);
  std::cout << SummaryLine(summary) << std::endl;
}

void RunRecorder::PrintLine(const std::string& line) {
  absl::MutexLock lock(&mu_);
  std::cout << line << std::endl;
}

namespace {
// A field of the summary as a number, or nullopt when it is absent or null (a run that never evaluated).
std::optional<double> NumberField(const nlohmann::json& summary, const char* key) {
  auto it = summary.find(key);
  if (it == summary.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}
}  // namespace

std::string SummaryLine(const nlohmann::json& summary) {
  std::string line = "summary: ";
  auto completed = summary.find("completed");
  const bool known = completed != summary.end() && completed->is_boolean();
  absl::StrAppend(&line, !known ? "ended" : completed->get<bool>() ? "completed" : "not completed");
  if (auto wall = NumberField(summary, "wall_seconds")) absl::StrAppendFormat(&line, " in %.1f s", *wall);
  if (auto steps = NumberField(summary, "steps")) absl::StrAppendFormat(&line, ", %.0f steps", *steps);
  if (auto epochs = NumberField(summary, "epochs")) absl::StrAppendFormat(&line, " (%.2f epochs)", *epochs);
  if (auto accuracy = NumberField(summary, "test_accuracy")) {
    absl::StrAppendFormat(&line, ", test accuracy %.4f", *accuracy);
    auto target = NumberField(summary, "target_accuracy");
    auto reached = NumberField(summary, "seconds_to_target");
    if (target && *target > 0 && reached) absl::StrAppendFormat(&line, " (%g reached after %.2f s)", *target, *reached);
  }
  auto reason = summary.find("stop_reason");
  if (reason != summary.end() && reason->is_string() && !reason->get<std::string>().empty()) {
    absl::StrAppend(&line, "; stop: ", reason->get<std::string>());
  }
  return line;
}

void RunSummary::SetLastEval(double e, double accuracy, double loss) {
  evaluated = true;
  epochs = e;
  test_accuracy = accuracy;
  test_loss = loss;
}

nlohmann::json RunSummary::ToJson() const {
  return {{"job", job},
          {"mode", mode},
          {"servers", servers},
          {"workers", workers},
          {"steps", steps},
          {"wall_seconds", wall_seconds},
          {"epochs", evaluated ? nlohmann::json(epochs) : nlohmann::json()},
          {"test_accuracy", evaluated ? nlohmann::json(test_accuracy) : nlohmann::json()},
          {"test_loss", evaluated ? nlohmann::json(test_loss) : nlohmann::json()},
          {"target_accuracy", std::round(target_accuracy * 1e6) / 1e6},  // a float's short decimal
          {"seconds_to_target", seconds_to_target ? nlohmann::json(*seconds_to_target) : nlohmann::json()},
          {"updates_applied", updates_applied},
          {"max_staleness", max_staleness}};
}

std::string ProgressLine(const EvalRecord& r) {
  return absl::StrFormat(
      "step %6d | epoch %5.2f | loss %.4f | test acc %.4f | %8.0f samples/s | max staleness %d | %6.1f s", r.step,
      r.epoch, r.train_loss, r.test_accuracy, r.samples_per_sec, r.max_staleness, r.wall_seconds);
}

}  // namespace tessera

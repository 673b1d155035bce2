// What a run leaves behind: `metrics.jsonl` (one JSON record per evaluation), `summary.json`, and a progress
// line on stdout per record.
#ifndef TESSERA_COMMON_DAEMON_RUN_RECORDER_H_
#define TESSERA_COMMON_DAEMON_RUN_RECORDER_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tessera {

// One evaluation of the model during a run.
struct EvalRecord {
  int64_t step = 0;            // the clock the evaluated values belong to
  double epoch = 0;            // passes over the training set by the whole cluster
  double wall_seconds = 0;     // since the job started
  double train_loss = 0;       // mean over the steps since the previous record
  double test_loss = 0;
  double test_accuracy = 0;
  double samples_per_sec = 0;  // whole cluster
  int64_t max_staleness = 0;   // largest staleness of any update so far
  int64_t updates_applied = 0; // model updates so far (chunk updates / chunks)
  // Since the job started, when the evaluating worker finished step `step`: the values' own time, whatever the
  // evaluation took (unset when not known).
  std::optional<double> clock_wall_seconds;
};

// The fields every summary.json has, whoever ran the job (the scheduler, or a worker in local mode).
struct RunSummary {
  std::string job;
  std::string mode;             // "sync", "async", "ssp(2)", "local"
  int servers = 0;
  int workers = 0;
  int64_t steps = 0;            // clocks every worker completed
  double wall_seconds = 0;
  bool evaluated = false;       // false: no evaluation happened; the evaluation fields are null in JSON
  double epochs = 0;            // at the last evaluation
  double test_accuracy = 0;     // at the last evaluation
  double test_loss = 0;
  double target_accuracy = 0;   // 0: none
  std::optional<double> seconds_to_target;
  int64_t updates_applied = 0;  // model updates
  int64_t max_staleness = 0;

  // Fills the evaluation fields from the last evaluation.
  void SetLastEval(double epochs, double test_accuracy, double test_loss);
  nlohmann::json ToJson() const;
};

// The steps' own time, for the summary's "training": from the end of the first step any worker finished to the end
// of the last, so start-up, declaration and data loading are left out (what a benchmark compares with a loop timed
// the same way). Thread-compatible.
class TrainingSpan {
 public:
  void Note(int64_t clock, absl::Time now);
  // {"seconds", "from_clock", "to_clock"}, and with `run_start` "first_step_wall_seconds" (when the first step
  // ended, in the seconds of the run's records); null before any step.
  nlohmann::json ToJson(std::optional<absl::Time> run_start = std::nullopt) const;

 private:
  absl::Time first_, last_;
  int64_t first_clock_ = -1, last_clock_ = -1;
};

// The one line a run ends with: "summary: " and the outcome in words (completed or not, steps, epochs, time, test
// accuracy, the target, the stop reason). The whole record is summary.json.
std::string SummaryLine(const nlohmann::json& summary);

// Appends records to <run_dir>/metrics.jsonl and writes <run_dir>/summary.json. Thread-safe.
class RunRecorder {
 public:
  // Creates `run_dir` (and parents). An empty `run_dir` records nothing but still prints progress lines.
  // `append`: metrics.jsonl keeps what it holds (a resumed run).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RunRecorder>> Create(const std::string& run_dir,
                                                                          bool append = false);

  // Appends one record and prints its progress line.
  [[nodiscard]] absl::Status Append(const EvalRecord& record);

  // Writes summary.json (through a temporary file and a rename), then prints the "summary: " line: the line
  // that tells whoever reads the output that the run's records are complete.
  [[nodiscard]] absl::Status WriteSummary(const nlohmann::json& summary);
  // The two halves of WriteSummary, for a caller that must change state between them.
  [[nodiscard]] absl::Status SaveSummary(const nlohmann::json& summary);
  void PrintSummary(const nlohmann::json& summary);
  // Prints `line` to the run's output (stdout) between the progress lines, e.g. "worker 1 joined the job", the
  // line a launcher learns a rank joined from.
  void PrintLine(const std::string& line);

  const std::string& run_dir() const { return run_dir_; }

  // Appends `event` as one line to <run_dir>/events.jsonl (the run's membership events, as they happen).
  void AppendEvent(const nlohmann::json& event);
  // The events <run_dir>/events.jsonl holds, oldest first (lines that do not parse are skipped); none without it.
  static std::vector<nlohmann::json> ReadEvents(const std::string& run_dir);

  // The run directory's earlier records (an unfinished run this one does not go on with) move to
  // <run_dir>/replaced-<UTC time>/, as ClaimRunDirectory's `overwrite` moves them, and metrics.jsonl starts empty.
  [[nodiscard]] absl::Status StartAfresh();

 private:
  explicit RunRecorder(std::string run_dir) : run_dir_(std::move(run_dir)) {}

  const std::string run_dir_;
  absl::Mutex mu_;
  std::ofstream metrics_ ABSL_GUARDED_BY(mu_);
  std::ofstream events_ ABSL_GUARDED_BY(mu_);
};

// A run directory must not mix two runs' records. OK when `run_dir` is empty, absent, or holds none of `records`
// (besides metrics.jsonl and summary.json, which every run writes). With `overwrite` the new run replaces the
// earlier one, whose files move to <run_dir>/replaced-<UTC time>/ (nothing is deleted: a restarted daemon must
// not destroy the records of the run before it). FAILED_PRECONDITION naming what is there otherwise.
[[nodiscard]] absl::Status ClaimRunDirectory(const std::string& run_dir, bool overwrite,
                                             const std::vector<std::string>& records = {});

// Whether `run_dir` holds a run that never ended: its metrics.jsonl, and no summary.json (its scheduler
// stopped before the job's end, so a restarted one may take the job back and add to its records).
bool UnfinishedRun(const std::string& run_dir);

// "step 400 | epoch 0.85 | loss 0.412 | test acc 0.852 | 5120 samples/s | max staleness 0 | 12.4 s"
std::string ProgressLine(const EvalRecord& record);

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_RUN_RECORDER_H_

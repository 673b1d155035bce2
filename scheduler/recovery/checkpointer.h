// Checkpoints of a job: when one is due, taking one, pruning old ones, and finding the newest complete one to
// resume or restore from.
//
// A checkpoint is a folder DIR/ckpt-NNNNNN holding one file per server (server-ID.shard: its chunks, with
// values, optimizer state, versions, clocks and the exactly-once sequence table) and the scheduler's file
// (scheduler.state: the cluster view, every worker's clock and data position), each with a checked header
// (common/model/checkpoint_file.h). The scheduler's file is written last, once every server's is in: a folder
// without it is incomplete and never used.
#ifndef TESSERA_SCHEDULER_RECOVERY_CHECKPOINTER_H_
#define TESSERA_SCHEDULER_RECOVERY_CHECKPOINTER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/checkpoint.pb.h"
#include "proto/job.pb.h"
#include "scheduler/server_control.h"

namespace tessera {

// What the checkpoints of a run came to: for the summary, /status and /metrics.
struct CheckpointStats {
  int64_t taken = 0;
  int64_t failed = 0;
  int64_t consecutive_failures = 0;
  std::string last_error;  // empty when none failed
};

struct CheckpointInfo {
  int64_t number = 0;
  std::string folder;
  std::vector<std::string> shard_files;  // paths
  tessera::v1::SchedulerCheckpoint state;
};

// Thread-safe; Take runs one at a time (the coordinator's executor calls it).
class Checkpointer {
 public:
  // `servers` is not owned. Off when the job has no checkpoint.dir.
  Checkpointer(const tessera::v1::JobSpec& job, ServerControl* servers, absl::Time start);

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  // Whether the job's cadence calls for a checkpoint now that the slowest worker is at `clock`. After a failed
  // checkpoint, not before its backoff has passed (1 s, doubling with each failure in a row, at most a minute).
  bool Due(int64_t clock, absl::Time now) const;

  // Takes a checkpoint at `clock` of `view`: every server writes its file (SYNC, `at_version`: each chunk as
  // its version reaches `clock`, waiting at most `timeout`), then the scheduler's file with `worker_clocks`; old checkpoints are pruned
  // to the job's checkpoint.keep. An error names the server or file that failed (RESOURCE_EXHAUSTED for a full
  // disk); the failed checkpoint's folder is removed, the failure counted, and the previous checkpoint stays
  // the latest. Folder numbers are never reused within a run.
  [[nodiscard]] absl::StatusOr<CheckpointInfo> Take(const tessera::v1::ShardMap& view, int64_t clock, bool at_version,
                                                    const std::vector<int64_t>& worker_clocks,
                                                    absl::Duration timeout);

  CheckpointStats stats() const;

  // A checkpoint folder the scheduler can use: `dir` is a folder (created when missing) in which files can be
  // made. INVALID_ARGUMENT naming `dir` and why otherwise. For the start, before the job runs.
  [[nodiscard]] static absl::Status CheckFolder(const std::string& dir);

  // The newest complete checkpoint taken (or resumed from); nullopt before any.
  std::optional<CheckpointInfo> latest() const;
  void set_latest(CheckpointInfo info);

  // The newest complete checkpoint under `dir` for job `job` whose every file passes its checks (a delta's, with
  // its full checkpoint's files before its own in shard_files). A refused file is logged (naming it and the check
  // that failed) and the checkpoint before it is tried. NOT_FOUND when none is usable.
  [[nodiscard]] static absl::StatusOr<CheckpointInfo> LoadLatest(const std::string& dir, const std::string& job);

  // Whether `job` can go on from `checkpoint`: the same model, data widths, optimizer kind and seed as the job
  // that wrote it, and the same workers and servers (what may change on a resume: the stop condition, the
  // learning rate, cadences, folders). FAILED_PRECONDITION naming the first field that differs and both values.
  [[nodiscard]] static absl::Status CheckResumable(const tessera::v1::JobSpec& job, const CheckpointInfo& checkpoint);

  static constexpr char kSchedulerFile[] = "scheduler.state";

 private:
  void Prune();
  // Takes the checkpoint into `info.folder` (numbered by Take), filling in `info`.
  // `base_folder` set: a delta over that full checkpoint (its servers' files come first in info.shard_files).
  [[nodiscard]] absl::Status Write(const tessera::v1::ShardMap& view, int64_t clock, bool at_version,
                                   const std::vector<int64_t>& worker_clocks, absl::Duration timeout,
                                   const std::string& base_folder, CheckpointInfo& info);

  const std::string dir_;
  const std::string job_;
  const tessera::v1::JobSpec spec_;  // recorded in every checkpoint
  const int64_t every_steps_;
  const absl::Duration every_;
  const int keep_;
  const int full_every_;  // checkpoint.full_every: one full checkpoint in so many, deltas between
  ServerControl* const servers_;

  mutable absl::Mutex mu_;
  std::optional<CheckpointInfo> latest_ ABSL_GUARDED_BY(mu_);
  absl::Time last_time_ ABSL_GUARDED_BY(mu_);
  int64_t next_number_ ABSL_GUARDED_BY(mu_) = 0;  // 0: from the folders on disk
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  CheckpointStats stats_ ABSL_GUARDED_BY(mu_);
  // The last full checkpoint this scheduler took (deltas apply over it; empty: the next one is full), and the
  // deltas taken since.
  std::string last_full_folder_ ABSL_GUARDED_BY(mu_);
  int deltas_since_full_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_RECOVERY_CHECKPOINTER_H_

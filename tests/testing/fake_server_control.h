// Servers for the scheduler's core without processes: a ServerControl that records every call, writes real
// (empty) checkpoint files, and fails a call when told to. For unit tests of the coordinator and the checkpointer,
// and for the scheduler's fuzzer.
//
//   FakeServerControl servers;
//   servers.FailCheckpoints(absl::ResourceExhaustedError("server 0: No space left on device"));
#ifndef TESSERA_TESTS_TESTING_FAKE_SERVER_CONTROL_H_
#define TESSERA_TESTS_TESTING_FAKE_SERVER_CONTROL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/model/checkpoint_file.h"
#include "proto/checkpoint.pb.h"
#include "scheduler/server_control.h"

namespace tessera::testing {

// Thread-safe.
class FakeServerControl final : public ServerControl {
 public:
  void SetControlKey(const std::string&, const std::string&) override {}

  absl::Status Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                      const std::vector<std::string>& restore_files, bool) override {
    absl::SleepFor(assign_delay());
    absl::MutexLock lock(&mu_);
    ++assigns_;
    if (views_ended_) return absl::CancelledError("the job has stopped: no view is handed over any more");
    if (!assign_error_.ok()) return assign_error_;
    assigned_ = map;
    job_name_ = job.name();
    restored_files_ = restore_files;
    return absl::OkStatus();
  }

  // Each server's file, a valid checkpoint file holding no chunks (what LoadLatest checks).
  absl::StatusOr<std::vector<std::string>> Checkpoint(const tessera::v1::ShardMap& map, const std::string& folder,
                                                      int64_t clock, bool, absl::Duration,
                                                      const std::string&) override {
    absl::MutexLock lock(&mu_);
    ++checkpoints_;
    if (!checkpoint_error_.ok()) return checkpoint_error_;
    std::vector<std::string> files;
    for (const auto& server : map.servers()) {
      files.push_back(absl::StrCat(folder, "/server-", server.id(), ".shard"));
      const CheckpointHeader header{job_name_, map.epoch(), clock};
      if (absl::Status written = WriteCheckpointFile(files.back(), header, tessera::v1::ShardCheckpoint());
          !written.ok()) {
        return written;
      }
    }
    return files;
  }

  std::vector<ServerStatsAnswer> Stats(const tessera::v1::ShardMap&) override { return {}; }
  absl::Status Probe(const std::string& address, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    probed_.push_back(address);
    return probe_answer_;
  }
  absl::Status Shutdown(const tessera::v1::ShardMap&) override {
    absl::MutexLock lock(&mu_);
    ++shutdowns_;
    return absl::OkStatus();
  }
  absl::Status DecideRounds(const tessera::v1::ShardMap&, const tessera::v1::DecideRoundsRequest&) override {
    return absl::OkStatus();
  }
  void EndViewChanges() override {
    absl::MutexLock lock(&mu_);
    views_ended_ = true;
  }
  bool views_ended() {
    absl::MutexLock lock(&mu_);
    return views_ended_;
  }

  // Every later call of that kind fails with `error` (OK: succeeds again).
  void FailAssign(absl::Status error) {
    absl::MutexLock lock(&mu_);
    assign_error_ = std::move(error);
  }
  // Every later Assign takes `delay` before it answers (as a frozen server's does, until its deadline).
  void SlowAssigns(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    assign_delay_ = delay;
  }
  // What every later Probe answers (OK: the server answers).
  void AnswerProbes(absl::Status answer) {
    absl::MutexLock lock(&mu_);
    probe_answer_ = std::move(answer);
  }
  std::vector<std::string> probed() {
    absl::MutexLock lock(&mu_);
    return probed_;
  }
  void FailCheckpoints(absl::Status error) {
    absl::MutexLock lock(&mu_);
    checkpoint_error_ = std::move(error);
  }
  // The job name written into checkpoint files (Assign records it from the job).
  void set_job_name(const std::string& name) {
    absl::MutexLock lock(&mu_);
    job_name_ = name;
  }

  int assigns() const {
    absl::MutexLock lock(&mu_);
    return assigns_;
  }
  int checkpoints() const {
    absl::MutexLock lock(&mu_);
    return checkpoints_;
  }
  int shutdowns() const {
    absl::MutexLock lock(&mu_);
    return shutdowns_;
  }
  // The last view every server took (an empty map before any).
  tessera::v1::ShardMap assigned() const {
    absl::MutexLock lock(&mu_);
    return assigned_;
  }
  std::vector<std::string> restored_files() const {
    absl::MutexLock lock(&mu_);
    return restored_files_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status probe_answer_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> probed_ ABSL_GUARDED_BY(mu_);
  absl::Duration assign_delay() const {
    absl::MutexLock lock(&mu_);
    return assign_delay_;
  }

  absl::Status assign_error_ ABSL_GUARDED_BY(mu_);
  absl::Duration assign_delay_ ABSL_GUARDED_BY(mu_);
  bool views_ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status checkpoint_error_ ABSL_GUARDED_BY(mu_);
  tessera::v1::ShardMap assigned_ ABSL_GUARDED_BY(mu_);
  std::string job_name_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> restored_files_ ABSL_GUARDED_BY(mu_);
  int assigns_ ABSL_GUARDED_BY(mu_) = 0;
  int checkpoints_ ABSL_GUARDED_BY(mu_) = 0;
  int shutdowns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FAKE_SERVER_CONTROL_H_

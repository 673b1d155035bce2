#include "scheduler/recovery/checkpointer.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/checkpoint_file.h"
#include "common/base/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "glog/logging.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// The checkpoint folders under `dir`, by number, newest first.
std::vector<std::pair<int64_t, fs::path>> Folders(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    int64_t number = 0;
    if (name.rfind("ckpt-", 0) == 0 && absl::SimpleAtoi(name.substr(5), &number)) out.emplace_back(number, entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

Checkpointer::Checkpointer(const tessera::v1::JobSpec& job, ServerControl* servers, absl::Time start)
    : dir_(job.checkpoint().dir()),
      job_(job.name()),
      spec_(job),
      every_steps_(job.checkpoint().every_steps()),
      every_(absl::Seconds(job.checkpoint().every_seconds())),
      keep_(std::max(1, job.checkpoint().keep())),
      full_every_(job.checkpoint().full_every()),
      servers_(servers),
      last_time_(start) {}

bool Checkpointer::Due(int64_t clock, absl::Time now) const {
  if (!enabled()) return false;
  absl::MutexLock lock(&mu_);
  if (now < retry_at_) return false;
  const int64_t last_clock = latest_ ? latest_->state.clock() : 0;
  if (every_steps_ > 0 && clock >= last_clock + every_steps_) return true;
  return every_ > absl::ZeroDuration() && now - last_time_ >= every_ && clock > last_clock;
}

absl::StatusOr<CheckpointInfo> Checkpointer::Take(const tessera::v1::ShardMap& view, int64_t clock, bool at_version,
                                                  const std::vector<int64_t>& worker_clocks, absl::Duration timeout) {
  if (!enabled()) return absl::FailedPreconditionError("no checkpoint.dir: checkpoints are off for this job");
  CheckpointInfo info;
  std::string base_folder;  // a delta's full checkpoint
  {
    absl::MutexLock lock(&mu_);
    if (full_every_ > 1 && !last_full_folder_.empty() && deltas_since_full_ + 1 < full_every_) {
      base_folder = last_full_folder_;
    }
    if (next_number_ == 0) {
      std::vector<std::pair<int64_t, fs::path>> existing = Folders(dir_);
      next_number_ = existing.empty() ? 1 : existing.front().first + 1;
    }
    info.number = next_number_++;
  }
  info.folder = absl::StrFormat("%s/ckpt-%06d", dir_, info.number);
  absl::Status written = Write(view, clock, at_version, worker_clocks, timeout, base_folder, info);
  if (!written.ok()) {
    // Nothing of a failed checkpoint stays: the servers' files, their temporary files, the folder.
    std::error_code error;
    fs::remove_all(info.folder, error);
    absl::MutexLock lock(&mu_);
    ++stats_.failed;
    ++stats_.consecutive_failures;
    stats_.last_error = written.ToString();
    const int doublings = static_cast<int>(std::min<int64_t>(stats_.consecutive_failures - 1, 6));
    retry_at_ = absl::Now() + std::min(absl::Seconds(1) * (int64_t{1} << doublings), absl::Minutes(1));
    return written;
  }
  {
    absl::MutexLock lock(&mu_);
    latest_ = info;
    if (base_folder.empty()) {
      last_full_folder_ = info.folder;
      deltas_since_full_ = 0;
    } else {
      ++deltas_since_full_;
    }
    last_time_ = absl::Now();
    ++stats_.taken;
    stats_.consecutive_failures = 0;
    retry_at_ = absl::InfinitePast();
  }
  Prune();
  return info;
}

absl::Status Checkpointer::Write(const tessera::v1::ShardMap& view, int64_t clock, bool at_version,
                                 const std::vector<int64_t>& worker_clocks, absl::Duration timeout,
                                 const std::string& base_folder, CheckpointInfo& info) {
  std::error_code error;
  fs::create_directories(info.folder, error);
  if (error) {
    return absl::Status(absl::ErrnoToStatusCode(error.value()),
                        absl::StrCat("cannot create ", info.folder, ": ", error.message()));
  }
  absl::StatusOr<std::vector<std::string>> files =
      servers_->Checkpoint(view, info.folder, clock, at_version, timeout, base_folder);
  if (!files.ok()) return files.status();
  info.shard_files.clear();
  if (!base_folder.empty()) {
    // A restore reads the full checkpoint's files, then this one's.
    info.state.set_base(fs::path(base_folder).filename().string());
    for (const auto& server : view.servers()) {
      info.shard_files.push_back(absl::StrCat(base_folder, "/server-", server.id(), ".shard"));
    }
  }
  *info.state.mutable_view() = view;
  for (int64_t c : worker_clocks) info.state.add_worker_clocks(c);
  info.state.set_clock(clock);
  *info.state.mutable_job() = spec_;
  for (const std::string& f : *files) {
    info.shard_files.push_back(f);
    info.state.add_shard_files(fs::path(f).filename().string());
  }
  CheckpointHeader header{job_, view.epoch(), clock};
  return WriteCheckpointFile(info.folder + "/" + kSchedulerFile, header, info.state);
}

absl::Status Checkpointer::CheckResumable(const tessera::v1::JobSpec& job, const CheckpointInfo& checkpoint) {
  const tessera::v1::ShardMap& view = checkpoint.state.view();
  const std::string from = absl::StrCat("cannot resume from ", checkpoint.folder, ": ");
  if (view.workers_size() != job.cluster().num_workers() ||
      checkpoint.state.worker_clocks_size() != job.cluster().num_workers() || checkpoint.shard_files.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        from, "it has ", view.workers_size(), " workers and ", checkpoint.shard_files.size(),
        " server files; the job asks for ", job.cluster().num_workers(), " workers and ",
        job.cluster().num_servers(), " servers"));
  }
  for (const auto& c : view.chunks()) {
    if (c.server_id() >= job.cluster().num_servers()) {
      return absl::FailedPreconditionError(absl::StrCat(from, "its chunks are on server ", c.server_id(),
                                                        "; the job has ", job.cluster().num_servers(), " servers"));
    }
  }
  if (!checkpoint.state.has_job()) return absl::OkStatus();  // older checkpoints: checked as workers declare
  const tessera::v1::JobSpec& was = checkpoint.state.job();
  // What shapes the parameters, their optimizer state and their values: it must be what the checkpoint holds.
  auto differs = [&](const std::string& field, const google::protobuf::Message& then,
                     const google::protobuf::Message& now) -> absl::Status {
    if (google::protobuf::util::MessageDifferencer::Equals(then, now)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(from, "job field ", field, " differs: the checkpoint has { ",
                                                      then.ShortDebugString(), " }, this job { ",
                                                      now.ShortDebugString(), " }"));
  };
  TESSERA_RETURN_IF_ERROR(differs("model", was.model(), job.model()));
  tessera::v1::DataSpec data_then, data_now;  // the widths of the data, not where its files are
  for (auto [from_spec, to] : {std::pair{&was.data(), &data_then}, std::pair{&job.data(), &data_now}}) {
    to->set_format(from_spec->format());
    to->set_synthetic_features(from_spec->synthetic_features());
    to->set_synthetic_classes(from_spec->synthetic_classes());
  }
  TESSERA_RETURN_IF_ERROR(differs("data (format and widths)", data_then, data_now));
  if (was.optimizer().kind() != job.optimizer().kind()) {
    return absl::FailedPreconditionError(absl::StrCat(
        from, "job field optimizer.kind differs: the checkpoint has ",
        tessera::v1::OptimizerSpec::Kind_Name(was.optimizer().kind()), ", this job ",
        tessera::v1::OptimizerSpec::Kind_Name(job.optimizer().kind())));
  }
  if (was.seed() != job.seed()) {
    return absl::FailedPreconditionError(
        absl::StrCat(from, "job field seed differs: the checkpoint has ", was.seed(), ", this job ", job.seed()));
  }
  return absl::OkStatus();
}

CheckpointStats Checkpointer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Checkpointer::CheckFolder(const std::string& dir) {
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_directory(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint folder ", dir, " exists and is not a folder"));
  }
  fs::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint folder ", dir, " cannot be created: ", error.message()));
  }
  // A file made and removed: the only sure test (a read-only mount, an ACL, root's bypass of permissions).
  std::string probe = dir + "/.tessera-probe-XXXXXX";
  const int fd = mkstemp(probe.data());
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint folder ", dir, " is not writable: ", strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

void Checkpointer::Prune() {
  int complete = 0;
  std::set<std::string> bases;  // full checkpoints a kept delta applies over
  for (const auto& [number, path] : Folders(dir_)) {
    const bool whole = fs::exists(path / kSchedulerFile);
    if (whole && complete < keep_) {
      ++complete;
      tessera::v1::SchedulerCheckpoint state;
      if (ReadCheckpointFile((path / kSchedulerFile).string(), &state).ok() && !state.base().empty()) {
        bases.insert(state.base());
      }
      continue;
    }
    if (whole && bases.count(path.filename().string()) != 0) continue;
    if (!whole && complete == 0) continue;  // newer than every complete one: may be in progress
    std::error_code error;
    fs::remove_all(path, error);
    if (error) LOG(WARNING) << "cannot delete old checkpoint " << path << ": " << error.message();
  }
}

std::optional<CheckpointInfo> Checkpointer::latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

void Checkpointer::set_latest(CheckpointInfo info) {
  absl::MutexLock lock(&mu_);
  latest_ = std::move(info);
}

absl::StatusOr<CheckpointInfo> Checkpointer::LoadLatest(const std::string& dir, const std::string& job) {
  if (!fs::is_directory(dir)) return absl::NotFoundError(absl::StrCat("no checkpoint folder ", dir));
  for (const auto& [number, path] : Folders(dir)) {
    CheckpointInfo info;
    info.number = number;
    info.folder = path.string();
    const std::string state_file = (path / kSchedulerFile).string();
    if (!fs::exists(state_file)) {
      LOG(WARNING) << "checkpoint " << path << " is incomplete (no " << kSchedulerFile << "); trying the one before";
      continue;
    }
    absl::StatusOr<CheckpointHeader> header = ReadCheckpointFile(state_file, &info.state);
    absl::Status usable = header.status();
    if (usable.ok() && header->job != job) {
      usable = absl::FailedPreconditionError(
          absl::StrCat("checkpoint file ", state_file, " is refused: it belongs to job '", header->job,
                       "', not '", job, "'"));
    }
    // A delta's full checkpoint comes first: it must be complete, and its files are read before the delta's.
    std::vector<std::string> files;
    if (usable.ok() && !info.state.base().empty()) {
      const fs::path base = fs::path(dir) / info.state.base();
      tessera::v1::SchedulerCheckpoint base_state;
      absl::StatusOr<CheckpointHeader> base_header =
          ReadCheckpointFile((base / kSchedulerFile).string(), &base_state);
      usable = base_header.status();
      if (!usable.ok()) {
        usable = absl::DataLossError(absl::StrCat("delta checkpoint ", path.string(), " is refused: its full checkpoint ",
                                                  base.string(), " is not usable (", usable.message(), ")"));
      }
      for (int i = 0; usable.ok() && i < base_state.shard_files_size(); ++i) {
        files.push_back((base / base_state.shard_files(i)).string());
      }
    }
    const size_t base_files = files.size();
    for (int i = 0; usable.ok() && i < info.state.shard_files_size(); ++i) {
      files.push_back((path / info.state.shard_files(i)).string());
    }
    // Every server's file must pass its checks too (a restore needs all of them).
    for (size_t i = 0; usable.ok() && i < files.size(); ++i) {
      const std::string& file = files[i];
      tessera::v1::ShardCheckpoint shard;
      absl::StatusOr<CheckpointHeader> shard_header = ReadCheckpointFile(file, &shard);
      usable = shard_header.status();
      if (usable.ok() && i >= base_files && shard_header->clock != info.state.clock()) {
        usable = absl::DataLossError(absl::StrCat("checkpoint file ", file, " is refused: its clock ",
                                                  shard_header->clock, " is not the checkpoint's ",
                                                  info.state.clock()));
      }
      info.shard_files.push_back(file);
    }
    if (!usable.ok()) {
      LOG(WARNING) << usable.message() << "; trying the checkpoint before " << path.filename().string();
      continue;
    }
    return info;
  }
  return absl::NotFoundError(absl::StrCat("no usable checkpoint in ", dir));
}

}  // namespace tessera

#include "server/shard_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/param_init.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera {

using tessera::v1::ConsistencySpec;
using tessera::v1::PullRequest;
using tessera::v1::PullResponse;
using tessera::v1::PushRequest;
using tessera::v1::PushResponse;

namespace {
std::string KeyName(const tessera::v1::ChunkKey& key) { return absl::StrCat(key.param(), "/", key.index()); }
}  // namespace

absl::Status ShardStore::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job,
                                int server_id) {
  absl::MutexLock lock(&mu_);
  if (server_id_ != -1 && server_id_ != server_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("this server is server ", server_id_, "; an assignment for server ", server_id, " came"));
  }
  server_id_ = server_id;
  if (config_ != nullptr && !google::protobuf::util::MessageDifferencer::Equals(config_->job, job)) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", server_id_, " already serves job '", config_->job.name(), "'; got '", job.name(), "'"));
  }
  if (map.epoch() <= epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard map epoch ", map.epoch(), " is not newer than the server's ", epoch_));
  }
  if (config_ == nullptr) config_ = std::make_unique<const JobConfig>(job);
  const int slots = config_->rule.state_slots();
  const int workers = job.cluster().num_workers();
  for (const auto& placement : map.chunks()) {
    if (placement.server_id() != server_id_) continue;
    auto key = std::make_pair(placement.param(), placement.index());
    if (chunks_.count(key) != 0) continue;
    auto spec = std::find_if(map.params().begin(), map.params().end(),
                                    [&](const auto& p) { return p.name() == placement.param(); });
    if (spec == map.params().end()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", placement.param(), "/",
                                                     placement.index(), " but declares no such parameter"));
    }
    auto chunk = std::make_unique<Chunk>(placement.length(), slots);
    absl::MutexLock chunk_lock(&chunk->mu);
    FillInit(spec->init(), spec->name(), placement.offset(), absl::MakeSpan(chunk->values));
    chunk->applied_clocks.assign(workers, 0);
    chunk->sync_sum.assign(placement.length(), 0.0f);
    chunks_[key] = std::move(chunk);
  }
  epoch_ = map.epoch();
  return absl::OkStatus();
}

absl::StatusOr<ShardStore::Found> ShardStore::Find(uint64_t epoch, const tessera::v1::ChunkKey& key) const {
  absl::ReaderMutexLock lock(&mu_);
  if (epoch < epoch_) {
    absl::Status status = absl::FailedPreconditionError(
        absl::StrCat("stale shard map: request has epoch ", epoch, ", server ", server_id_, " is at epoch ", epoch_));
    SetCurrentEpoch(status, epoch_);
    return status;
  }
  if (epoch > epoch_) {
    return absl::UnavailableError(absl::StrCat("server ", server_id_, " is at shard map epoch ", epoch_,
                                               ", request has ", epoch, "; its assignment is on the way"));
  }
  auto it = chunks_.find(std::make_pair(key.param(), key.index()));
  if (it == chunks_.end()) {
    std::vector<std::string> held;
    for (const auto& [k, unused] : chunks_) {
      if (held.empty() || held.back() != k.first) held.push_back(k.first);
    }
    return absl::NotFoundError(absl::StrCat("unknown parameter chunk '", KeyName(key), "' on server ", server_id_,
                                            " (it holds chunks of: ", absl::StrJoin(held, ", "), ")"));
  }
  return Found{it->second.get(), config_.get()};
}

absl::StatusOr<PullResponse> ShardStore::Pull(const PullRequest& request) const {
  TESSERA_ASSIGN_OR_RETURN(Found found, Find(request.epoch(), request.key()));
  Chunk& chunk = *found.chunk;
  PullResponse response;
  absl::MutexLock lock(&chunk.mu);
  response.set_version(chunk.version);
  response.set_clock_version(ClockVersionLocked(chunk));
  if (request.have_version() != chunk.version) EncodeFloats(chunk.values, response.mutable_data());
  return response;
}

int64_t ShardStore::ClockVersionLocked(const Chunk& chunk) {
  if (chunk.applied_clocks.empty()) return 0;
  return *std::min_element(chunk.applied_clocks.begin(), chunk.applied_clocks.end());
}

void ShardStore::ApplyLocked(const JobConfig& config, Chunk& chunk, absl::Span<const float> grad, float lr_scale,
                             const std::vector<int>& workers, int64_t clock) {
  ++chunk.gradient_updates;
  config.rule.Apply(absl::MakeSpan(chunk.values), grad, absl::MakeSpan(chunk.state), chunk.gradient_updates,
                    lr_scale);
  ++chunk.version;
  for (int w : workers) chunk.applied_clocks[w] = std::max(chunk.applied_clocks[w], clock + 1);
}

absl::StatusOr<PushResponse> ShardStore::Push(const PushRequest& request) {
  TESSERA_ASSIGN_OR_RETURN(Found found, Find(request.epoch(), request.key()));
  Chunk& chunk = *found.chunk;
  const JobConfig& config = *found.config;
  const tessera::v1::JobSpec& job = config.job;
  const int worker = request.worker_id();
  if (worker < 0 || worker >= job.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker, " out of range: the job has ",
                                                   job.cluster().num_workers(), " workers"));
  }
  if (request.seq() == 0) return absl::InvalidArgumentError("push seq must be >= 1");
  const std::string what = absl::StrCat("push to ", KeyName(request.key()));

  // Decode and validate outside the chunk lock; nothing has changed if this fails.
  std::vector<float> values;
  {
    absl::ReaderMutexLock lock(&chunk.mu);
    values.resize(chunk.values.size());
  }
  TESSERA_RETURN_IF_ERROR(DecodeFloats(request.data(), absl::MakeSpan(values), what));
  if (request.kind() == PushRequest::GRADIENT) TESSERA_RETURN_IF_ERROR(CheckFinite(values, what));
  if (request.kind() == PushRequest::GRADIENT && request.batch_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch_size must be > 0, got ", request.batch_size()));
  }

  PushResponse response;
  int64_t staleness = -1;
  bool late = false;
  {
    absl::MutexLock lock(&chunk.mu);
    auto seq_it = chunk.last_seq.find(worker);
    if (seq_it != chunk.last_seq.end() && request.seq() <= seq_it->second) {
      response.set_version(chunk.version);
      response.set_duplicate(true);
    } else if (request.kind() == PushRequest::ASSIGN) {
      chunk.values = std::move(values);
      ++chunk.version;
      chunk.last_seq[worker] = request.seq();
    } else if (job.consistency().mode() == ConsistencySpec::SYNC) {
      const int64_t round = chunk.version;
      if (request.clock() < round) {
        late = true;  // the round closed without it; never mixed into a later round
        chunk.last_seq[worker] = request.seq();
      } else if (request.clock() > round) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": round ", request.clock(),
                                                          " is not open yet; the chunk is collecting round ", round));
      } else if (std::find(chunk.sync_workers.begin(), chunk.sync_workers.end(), worker) !=
                 chunk.sync_workers.end()) {
        return absl::AbortedError(absl::StrCat(what, ": worker ", worker, " already pushed round ", round,
                                               " with another seq"));
      } else {
        chunk.last_seq[worker] = request.seq();
        const float weight = static_cast<float>(request.batch_size());
        for (size_t i = 0; i < values.size(); ++i) chunk.sync_sum[i] += weight * values[i];
        chunk.sync_weight += request.batch_size();
        chunk.sync_workers.push_back(worker);
        staleness = request.clock() - request.read_clock_version();
        if (static_cast<int>(chunk.sync_workers.size()) == job.cluster().num_workers()) {
          const float inv = static_cast<float>(1.0 / chunk.sync_weight);
          for (float& v : chunk.sync_sum) v *= inv;
          ApplyLocked(config, chunk, chunk.sync_sum, 1.0f, chunk.sync_workers, round);
          std::fill(chunk.sync_sum.begin(), chunk.sync_sum.end(), 0.0f);
          chunk.sync_weight = 0;
          chunk.sync_workers.clear();
        }
      }
      response.set_version(chunk.version);
    } else {
      chunk.last_seq[worker] = request.seq();
      staleness = std::max<int64_t>(0, request.clock() - request.read_clock_version());
      const float scale =
          job.consistency().staleness_aware_lr() ? 1.0f / static_cast<float>(std::max<int64_t>(1, staleness)) : 1.0f;
      ApplyLocked(config, chunk, values, scale, {worker}, request.clock());
      response.set_version(chunk.version);
    }
  }

  absl::MutexLock lock(&counters_mu_);
  ++counters_.pushes;
  if (response.duplicate()) ++counters_.duplicate_pushes;
  if (late) ++counters_.late_pushes;
  if (staleness >= 0) counters_.staleness.Add(staleness);
  return response;
}

tessera::v1::ServerStats ShardStore::Stats() const {
  tessera::v1::ServerStats stats;
  {
    absl::ReaderMutexLock lock(&mu_);
    stats.set_server_id(server_id_);
    int64_t updates = 0;
    for (const auto& [key, chunk] : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
      updates += chunk->gradient_updates;
      stats.set_bytes(stats.bytes() + static_cast<int64_t>(chunk->values.size() * sizeof(float)));
    }
    stats.set_chunks(static_cast<int64_t>(chunks_.size()));
    stats.set_updates_applied(updates);
  }
  absl::MutexLock lock(&counters_mu_);
  stats.set_pushes(counters_.pushes);
  stats.set_duplicate_pushes(counters_.duplicate_pushes);
  stats.set_late_pushes(counters_.late_pushes);
  *stats.mutable_staleness() = counters_.staleness.ToProto();
  return stats;
}

}  // namespace tessera

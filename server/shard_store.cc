#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/param_init.h"
#include "common/job_spec.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/wire_limits.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera {

using tessera::v1::ConsistencySpec;

namespace {
std::string KeyName(const ChunkAddress& a) { return absl::StrCat(std::string(a.param), "/", a.index); }

// A view from the wire, checked before anything is allocated from it: the job must be valid, every chunk of a
// declared parameter, within it and no longer than the job's chunk_bytes, and every size within the limits of
// common/wire_limits.h.
absl::Status ValidateAssignment(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job) {
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  if (map.epoch() > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("shard map epoch ", map.epoch(), " is beyond ", kMaxEpoch));
  }
  if (map.params_size() > kMaxParameters || map.chunks_size() > kMaxChunks) {
    return absl::InvalidArgumentError(absl::StrCat("shard map with ", map.params_size(), " parameters and ",
                                                   map.chunks_size(), " chunks; at most ", kMaxParameters, " and ",
                                                   kMaxChunks));
  }
  std::map<std::string_view, int64_t> elements;
  for (const auto& p : map.params()) {
    TESSERA_RETURN_IF_ERROR(CheckLength("parameter name", p.name(), kMaxNameBytes));
    TESSERA_RETURN_IF_ERROR(CheckKnownEnums(p));
    if (p.dtype() != tessera::v1::DT_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", p.name(), "': only float32 is supported"));
    }
    TESSERA_ASSIGN_OR_RETURN(elements[p.name()], CheckedElements(p.shape(), absl::StrCat("parameter '", p.name(), "'")));
  }
  const int64_t max_length = std::max<int64_t>(1, job.chunk_bytes() / 4);
  for (const auto& c : map.chunks()) {
    auto it = elements.find(c.param());
    if (it == elements.end()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", c.param().substr(0, kMaxNameBytes),
                                                     "/", c.index(), " but declares no such parameter"));
    }
    if (c.index() < 0 || c.length() <= 0 || c.length() > max_length || c.offset() < 0 ||
        c.offset() > it->second - c.length()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map chunk ", c.param(), "/", c.index(), " (offset ",
                                                     c.offset(), ", length ", c.length(), ") is not within the ",
                                                     it->second, " elements of its parameter in chunks of at most ",
                                                     max_length));
    }
  }
  for (const auto& w : map.workers()) {
    if (!w.key_digest().empty() && w.key_digest().size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w.id(), ": a key digest is 32 bytes"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

bool ExchangeWaiter::Complete(absl::StatusOr<ChunkValues> result) {
  std::function<void(absl::StatusOr<ChunkValues>)> done;
  {
    absl::MutexLock lock(&mu_);
    if (!done_) return false;
    done = std::move(done_);
    done_ = nullptr;
  }
  done(std::move(result));
  return true;
}

bool ExchangeWaiter::completed() const {
  absl::MutexLock lock(&mu_);
  return !done_;
}

absl::Status ShardStore::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
                                const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all) {
  // Rounds the new view closes and exchanges of rounds a rollback dropped, answered once no lock is held.
  ClosedRounds closed;
  std::vector<std::shared_ptr<ExchangeWaiter>> dropped;
  absl::Status status = AdoptView(map, job, server_id, restore, restore_all, closed, dropped);
  for (auto& [waiters, values] : closed) {
    for (auto& w : waiters) w->Complete(values);
  }
  for (auto& w : dropped) {
    w->Complete(absl::UnavailableError(absl::StrCat("the chunk was restored from a checkpoint or moved to another ",
                                                    "server (cluster view epoch ", map.epoch(), "); ask again")));
  }
  return status;
}

tessera::v1::ChunkState ShardStore::ChunkStateLocked(const std::string& param, int index, const Chunk& chunk) {
  tessera::v1::ChunkState state;
  state.set_param(param);
  state.set_index(index);
  state.set_values(std::string(reinterpret_cast<const char*>(chunk.values.data()), chunk.values.size() * sizeof(float)));
  state.set_optimizer_state(
      std::string(reinterpret_cast<const char*>(chunk.state.data()), chunk.state.size() * sizeof(float)));
  state.set_version(chunk.version);
  state.set_gradient_updates(chunk.gradient_updates);
  for (int64_t c : chunk.applied_clocks) state.add_applied_clocks(c);
  for (const auto& [worker, seq] : chunk.last_seq) (*state.mutable_last_seq())[worker] = seq;
  return state;
}

void ShardStore::RestoreChunkLocked(const tessera::v1::ChunkState& state, const std::vector<bool>& keep_seq,
                                    Chunk& chunk, std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) {
  std::memcpy(chunk.values.data(), state.values().data(), state.values().size());
  std::memcpy(chunk.state.data(), state.optimizer_state().data(), state.optimizer_state().size());
  chunk.values_bound = std::numeric_limits<float>::infinity();  // not known until the next update measures them
  chunk.state_bound = std::numeric_limits<float>::infinity();
  chunk.version = state.version();
  chunk.gradient_updates = state.gradient_updates();
  for (int w = 0; w < state.applied_clocks_size() && w < static_cast<int>(chunk.applied_clocks.size()); ++w) {
    chunk.applied_clocks[w] = state.applied_clocks(w);
  }
  chunk.last_seq.clear();
  for (const auto& [worker, seq] : state.last_seq()) {
    if (worker >= 0 && worker < static_cast<int>(keep_seq.size()) && keep_seq[worker]) chunk.last_seq[worker] = seq;
  }
  chunk.sync_weight = 0;
  chunk.sync_workers.clear();
  std::fill(chunk.pending_batch.begin(), chunk.pending_batch.end(), 0);
  for (auto& w : chunk.waiters) dropped.push_back(std::move(w));
  chunk.waiters.clear();
}

void ShardStore::OfferToSnapshotLocked(const Chunk& chunk) {
  if (snapshot_at_.load() != chunk.version) return;
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_.try_emplace(chunk.key, ChunkStateLocked(chunk.key.first, chunk.key.second, chunk));
}

absl::StatusOr<tessera::v1::ShardCheckpoint> ShardStore::Snapshot(int64_t at_version, absl::Time deadline,
                                                                  const std::function<bool()>& cancelled) {
  tessera::v1::ShardCheckpoint out;
  std::vector<Chunk*> chunks;  // chunks are never removed, so the pointers stay valid
  {
    absl::ReaderMutexLock lock(&mu_);
    out.set_server_id(server_id_);
    if (roster_ != nullptr) {
      for (uint64_t inc : roster_->incarnation) out.add_worker_incarnations(inc);
    }
    for (const auto& [key, chunk] : chunks_) chunks.push_back(chunk.get());
  }
  if (at_version < 0) {
    for (Chunk* chunk : chunks) {
      absl::MutexLock chunk_lock(&chunk->mu);
      *out.add_chunks() = ChunkStateLocked(chunk->key.first, chunk->key.second, *chunk);
    }
    return out;
  }
  {
    absl::MutexLock snap(&snapshot_mu_);
    snapshot_.clear();
  }
  snapshot_at_ = at_version;
  absl::Status status;
  for (Chunk* chunk : chunks) {
    absl::MutexLock chunk_lock(&chunk->mu);
    if (chunk->version == at_version) OfferToSnapshotLocked(*chunk);
    if (chunk->version > at_version) {
      absl::MutexLock snap(&snapshot_mu_);
      if (snapshot_.count(chunk->key) == 0) {
        status = absl::FailedPreconditionError(absl::StrCat("chunk ", chunk->key.first, "/", chunk->key.second,
                                                            " is at version ", chunk->version,
                                                            ", past the checkpoint's ", at_version));
      }
    }
  }
  absl::MutexLock snap(&snapshot_mu_);
  if (status.ok()) {
    auto complete = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_) { return snapshot_.size() >= chunks.size(); };
    bool done = false;
    while (!done && absl::Now() < deadline && status.ok()) {
      done = snapshot_mu_.AwaitWithDeadline(absl::Condition(&complete),
                                            std::min(deadline, absl::Now() + absl::Milliseconds(100)));
      if (!done && cancelled && cancelled()) status = absl::CancelledError("the checkpoint was called off");
    }
    if (status.ok() && !done) {
      std::vector<std::string> missing;
      for (Chunk* chunk : chunks) {
        if (snapshot_.count(chunk->key) == 0 && missing.size() < 5) {
          missing.push_back(absl::StrCat(chunk->key.first, "/", chunk->key.second));
        }
      }
      status = absl::DeadlineExceededError(absl::StrCat("server ", out.server_id(), ": ",
                                                        chunks.size() - snapshot_.size(),
                                                        " chunks did not reach version ", at_version,
                                                        " in time, e.g. ", absl::StrJoin(missing, ", ")));
    }
  }
  snapshot_at_ = -1;
  if (status.ok()) {
    for (auto& [key, state] : snapshot_) *out.add_chunks() = std::move(state);
  }
  snapshot_.clear();
  if (!status.ok()) return status;
  return out;
}

absl::Status ShardStore::AdoptView(
    const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
    const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all,
    ClosedRounds& closed,
    std::vector<std::shared_ptr<ExchangeWaiter>>& dropped) {
  TESSERA_RETURN_IF_ERROR(ValidateAssignment(map, job));
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
  if (map.epoch() == epoch_ && map.epoch() > 0) return absl::OkStatus();  // this view again: nothing to do
  if (map.epoch() <= epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard map epoch ", map.epoch(), " is not newer than the server's ", epoch_));
  }
  if (config_ == nullptr) config_ = std::make_unique<const JobConfig>(job);
  const int slots = config_->rule.state_slots();
  const int workers = job.cluster().num_workers();
  // Chunk states in the checkpoint to restore from, by key.
  std::map<std::pair<std::string, int>, const tessera::v1::ChunkState*> saved;
  if (restore != nullptr) {
    for (const auto& file : *restore) {
      for (const auto& c : file.chunks()) saved[{c.param(), c.index()}] = &c;
    }
  }
  std::vector<bool> keep_seq(workers, false);  // ranks whose incarnation the checkpoint saw
  if (restore != nullptr && !restore->empty()) {
    const auto& seen = restore->front().worker_incarnations();
    for (const auto& w : map.workers()) {
      // Only the very process the checkpoint saw continues its sequence (0 means "not known": a new process).
      if (w.id() >= 0 && w.id() < workers && w.id() < seen.size()) {
        keep_seq[w.id()] = w.incarnation() != 0 && seen[w.id()] == w.incarnation();
      }
    }
  }
  // Callers hold chunk.mu (the analysis cannot name a lambda parameter's mutex).
  auto restore_into = [&](const std::pair<std::string, int>& key, Chunk& chunk) ABSL_NO_THREAD_SAFETY_ANALYSIS
      -> absl::Status {
    auto it = saved.find(key);
    if (it == saved.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", key.first, "/", key.second, " is in none of the checkpoint's files"));
    }
    const tessera::v1::ChunkState& state = *it->second;
    if (state.values().size() != chunk.values.size() * sizeof(float) ||
        state.optimizer_state().size() != chunk.state.size() * sizeof(float)) {
      return absl::FailedPreconditionError(absl::StrCat("chunk ", key.first, "/", key.second,
                                                        " in the checkpoint has another size than the job's"));
    }
    // Nothing non-finite enters the values, a checkpoint's included.
    for (const std::string* bytes : {&state.values(), &state.optimizer_state()}) {
      std::vector<float> floats(bytes->size() / sizeof(float));
      if (!floats.empty()) std::memcpy(floats.data(), bytes->data(), floats.size() * sizeof(float));
      TESSERA_RETURN_IF_ERROR(CheckFinite(floats, absl::StrCat("checkpoint chunk ", key.first, "/", key.second)));
    }
    RestoreChunkLocked(state, keep_seq, chunk, dropped);
    return absl::OkStatus();
  };
  for (const auto& placement : map.chunks()) {
    if (placement.server_id() != server_id_) continue;
    auto key = std::make_pair(placement.param(), placement.index());
    if (chunks_.count(key) != 0) {
      if (restore != nullptr && restore_all) {
        Chunk& chunk = *chunks_[key];
        absl::MutexLock chunk_lock(&chunk.mu);
        TESSERA_RETURN_IF_ERROR(restore_into(key, chunk));
      }
      continue;
    }
    auto spec = std::find_if(map.params().begin(), map.params().end(),
                                    [&](const auto& p) { return p.name() == placement.param(); });
    if (spec == map.params().end()) {
      return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", placement.param(), "/",
                                                     placement.index(), " but declares no such parameter"));
    }
    auto chunk = std::make_unique<Chunk>(placement.param(), placement.index(), placement.length(), slots);
    absl::MutexLock chunk_lock(&chunk->mu);
    chunk->applied_clocks.assign(workers, 0);
    if (job.consistency().mode() == ConsistencySpec::SYNC) chunk->sync_sum.assign(placement.length(), 0.0f);
    if (job.consistency().backup_workers() > 0) {
      chunk->pending.resize(workers);
      chunk->pending_batch.assign(workers, 0);
    }
    if (restore != nullptr) {
      TESSERA_RETURN_IF_ERROR(restore_into(key, *chunk));
    } else {
      FillInit(spec->init(), spec->name(), placement.offset(), absl::MakeSpan(chunk->values));
    }
    chunks_[key] = std::move(chunk);
  }
  // Chunks the view has moved to another server leave this one. They are retired, not freed: a request that
  // found one before this view keeps a valid object (what it does there no longer counts).
  std::set<std::pair<std::string, int>> here;
  for (const auto& placement : map.chunks()) {
    if (placement.server_id() == server_id_) here.emplace(placement.param(), placement.index());
  }
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    if (here.count(it->first) != 0) {
      ++it;
      continue;
    }
    {
      absl::MutexLock chunk_lock(&it->second->mu);
      for (auto& w : it->second->waiters) dropped.push_back(std::move(w));
      it->second->waiters.clear();
    }
    retired_.push_back(std::move(it->second));
    it = chunks_.erase(it);
  }
  // The view's workers. A map without them (one built by hand) keeps every worker in, unchecked.
  auto roster = std::make_shared<Roster>();
  roster->active.assign(workers, true);
  roster->incarnation.assign(workers, 0);
  roster->joined_clock.assign(workers, 0);
  roster->key_digest.assign(workers, "");
  for (const auto& w : map.workers()) {
    if (w.id() < 0 || w.id() >= workers) {
      return absl::InvalidArgumentError(absl::StrCat("cluster view names worker ", w.id(), "; the job has ", workers));
    }
    roster->active[w.id()] = w.active();
    roster->incarnation[w.id()] = w.incarnation();
    roster->joined_clock[w.id()] = w.joined_clock();
    roster->key_digest[w.id()] = w.key_digest();
  }
  std::vector<int> renewed;  // ranks with a new incarnation: a new process, whose sequence starts again
  for (int w = 0; w < workers; ++w) {
    if (roster_ != nullptr && roster->incarnation[w] != roster_->incarnation[w]) renewed.push_back(w);
  }
  const bool sync = job.consistency().mode() == ConsistencySpec::SYNC;
  int64_t late_dropped = 0;  // late gradients left out of the rounds closed here
  for (auto& [key, chunk] : chunks_) {
    absl::MutexLock chunk_lock(&chunk->mu);
    for (int w : renewed) {
      chunk->last_seq.erase(w);
      chunk->applied_clocks[w] = std::max(chunk->applied_clocks[w], roster->joined_clock[w]);
    }
    if (sync) CloseIfCompleteLocked(*config_, *chunk, *roster, late_dropped, closed);
  }
  if (late_dropped > 0) {
    absl::MutexLock counters_lock(&counters_mu_);
    counters_.late_pushes += late_dropped;
  }
  roster_ = std::move(roster);
  epoch_ = map.epoch();
  return absl::OkStatus();
}

bool ShardStore::RoundCompleteLocked(const Chunk& chunk, const Roster& roster) const {
  if (!chunk.pending_batch.empty()) {  // backup workers: the scheduler names the members
    std::shared_ptr<const std::vector<int>> members = MembersOf(chunk.version);
    if (members == nullptr) return false;
    for (int w : *members) {
      if (w < static_cast<int>(roster.active.size()) && roster.InRound(w, chunk.version) && chunk.pending_batch[w] == 0) {
        return false;
      }
    }
    return true;
  }
  for (size_t w = 0; w < roster.active.size(); ++w) {
    if (!roster.InRound(static_cast<int>(w), chunk.version)) continue;
    if (std::find(chunk.sync_workers.begin(), chunk.sync_workers.end(), static_cast<int>(w)) ==
        chunk.sync_workers.end()) {
      return false;
    }
  }
  return true;
}

std::vector<std::shared_ptr<ExchangeWaiter>> ShardStore::CloseRoundLocked(const JobConfig& config, Chunk& chunk,
                                                                          int64_t* dropped) const {
  if (!chunk.pending_batch.empty()) {
    // The members' gradients, weighted by batch size, make the round; everyone else's are late.
    std::shared_ptr<const std::vector<int>> members = MembersOf(chunk.version);
    chunk.sync_workers.clear();
    chunk.sync_weight = 0;
    for (size_t w = 0; w < chunk.pending_batch.size(); ++w) {
      if (chunk.pending_batch[w] == 0) continue;
      const bool member = members != nullptr && std::binary_search(members->begin(), members->end(), static_cast<int>(w));
      if (!member) {
        if (dropped != nullptr) ++*dropped;
      } else {
        const float weight = static_cast<float>(chunk.pending_batch[w]);
        const std::vector<float>& g = chunk.pending[w];
        if (chunk.sync_workers.empty()) {
          for (size_t i = 0; i < g.size(); ++i) chunk.sync_sum[i] = weight * g[i];
        } else {
          for (size_t i = 0; i < g.size(); ++i) chunk.sync_sum[i] += weight * g[i];
        }
        chunk.sync_weight += chunk.pending_batch[w];
        chunk.sync_workers.push_back(static_cast<int>(w));
      }
      chunk.pending_batch[w] = 0;
    }
    // The round is over for everyone: a late worker's gradient of it never comes in, so it holds nobody's
    // staleness back (clock_version).
    for (int64_t& applied : chunk.applied_clocks) applied = std::max(applied, chunk.version + 1);
    if (chunk.sync_workers.empty()) {
      ++chunk.version;  // every member left the job: the round closes with no update
      std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
      waiters.swap(chunk.waiters);
      return waiters;
    }
  }
  const float inv = static_cast<float>(1.0 / chunk.sync_weight);
  if (!ApplyLocked(config, chunk, chunk.sync_sum, 1.0f, inv, chunk.sync_workers, chunk.version)) {
    // The round's mean would overflow the values: the round closes without an update, so nobody waits forever.
    LOG_EVERY_N(WARNING, 100) << "chunk " << chunk.key.first << "/" << chunk.key.second << ": round "
                              << chunk.version << "'s update would make values non-finite; left out";
    for (int w : chunk.sync_workers) chunk.applied_clocks[w] = std::max(chunk.applied_clocks[w], chunk.version + 1);
    ++chunk.version;
  }
  chunk.sync_weight = 0;
  chunk.sync_workers.clear();
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
  waiters.swap(chunk.waiters);
  return waiters;
}

void ShardStore::CloseIfCompleteLocked(const JobConfig& config, Chunk& chunk, const Roster& roster, int64_t& dropped,
                                       ClosedRounds& closed) {
  // Nothing collected yet: the round closes when its gradients arrive.
  const bool collecting = !chunk.sync_workers.empty() ||
                          std::any_of(chunk.pending_batch.begin(), chunk.pending_batch.end(), [](int b) { return b > 0; });
  if (!collecting || !RoundCompleteLocked(chunk, roster)) return;
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters = CloseRoundLocked(config, chunk, &dropped);
  OfferToSnapshotLocked(chunk);
  closed.emplace_back(std::move(waiters), SnapshotLocked(chunk, roster));
}

std::shared_ptr<const std::vector<int>> ShardStore::MembersOf(int64_t round) const {
  absl::MutexLock lock(&decided_mu_);
  auto it = decided_.find(round);
  return it == decided_.end() ? nullptr : it->second;
}

absl::Status ShardStore::DecideRounds(const tessera::v1::DecideRoundsRequest& request) {
  if (request.rounds_size() > static_cast<int>(kDecidedRoundsKept)) {
    return absl::InvalidArgumentError(absl::StrCat(request.rounds_size(), " rounds decided at once; at most ",
                                                   kDecidedRoundsKept));
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    const int workers = config_ == nullptr ? 0 : config_->job.cluster().num_workers();
    for (const auto& round : request.rounds()) {
      if (round.round() < 0 || round.round() > kMaxClock || round.workers_size() > workers) {
        return absl::InvalidArgumentError(absl::StrCat("round ", round.round(), " with ", round.workers_size(),
                                                       " workers is not a round of this job"));
      }
      for (int w : round.workers()) {
        if (w < 0 || w >= workers) {
          return absl::InvalidArgumentError(absl::StrCat("round ", round.round(), " names worker ", w,
                                                         "; the job has ", workers));
        }
      }
    }
  }
  {
    absl::MutexLock lock(&decided_mu_);
    for (const auto& round : request.rounds()) {
      // The newest word on a round wins (a job rolled back to a checkpoint decides its rounds again).
      std::vector<int> members(round.workers().begin(), round.workers().end());
      std::sort(members.begin(), members.end());
      decided_[round.round()] = std::make_shared<const std::vector<int>>(std::move(members));
    }
    while (decided_.size() > kDecidedRoundsKept) decided_.erase(decided_.begin());
  }
  ClosedRounds closed;
  int64_t dropped = 0;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (config_ == nullptr || roster_ == nullptr) return absl::OkStatus();
    for (auto& [key, chunk] : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
      if (!chunk->pending_batch.empty()) CloseIfCompleteLocked(*config_, *chunk, *roster_, dropped, closed);
    }
  }
  if (dropped > 0) {
    absl::MutexLock lock(&counters_mu_);
    counters_.late_pushes += dropped;
  }
  for (auto& [waiters, values] : closed) {
    for (auto& w : waiters) w->Complete(values);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardStore::Found> ShardStore::Find(const ChunkAddress& address) const {
  absl::ReaderMutexLock lock(&mu_);
  if (address.epoch < epoch_) {
    absl::Status status = absl::FailedPreconditionError(absl::StrCat(
        "stale shard map: request has epoch ", address.epoch, ", server ", server_id_, " is at epoch ", epoch_));
    SetCurrentEpoch(status, epoch_);
    return status;
  }
  if (address.epoch > epoch_) {
    return absl::UnavailableError(absl::StrCat("server ", server_id_, " is at shard map epoch ", epoch_,
                                               ", request has ", address.epoch, "; its assignment is on the way"));
  }
  auto it = chunks_.find(std::make_pair(std::string(address.param), address.index));
  if (it == chunks_.end()) {
    std::vector<std::string> held;
    for (const auto& [k, unused] : chunks_) {
      if (held.empty() || held.back() != k.first) held.push_back(k.first);
    }
    return absl::NotFoundError(absl::StrCat("unknown parameter chunk '", KeyName(address), "' on server ",
                                            server_id_, " (it holds chunks of: ", absl::StrJoin(held, ", "), ")"));
  }
  return Found{it->second.get(), config_.get(), roster_};
}

ChunkValues ShardStore::SnapshotLocked(const Chunk& chunk, const Roster& roster) const {
  ChunkValues values;
  values.version = chunk.version;
  values.clock_version = ClockVersionLocked(chunk, roster);
  values.length = chunk.values.size() * sizeof(float);
  std::shared_ptr<PooledBuffer> buffer = buffers_.Get(values.length);
  if (values.length > 0) std::memcpy(buffer->data(), chunk.values.data(), values.length);
  values.bytes = std::move(buffer);
  return values;
}

absl::StatusOr<ChunkValues> ShardStore::Pull(const ChunkPull& request) const {
  TESSERA_ASSIGN_OR_RETURN(Found found, Find(request.address));
  const int workers = found.config->job.cluster().num_workers();
  if (request.worker_id < 0 || request.worker_id >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("pull from worker id ", request.worker_id, ": the job has ", workers, " workers"));
  }
  Chunk& chunk = *found.chunk;
  absl::MutexLock lock(&chunk.mu);
  if (request.have_version == chunk.version) {
    ChunkValues unchanged;
    unchanged.version = chunk.version;
    unchanged.clock_version = ClockVersionLocked(chunk, *found.roster);
    return unchanged;
  }
  return SnapshotLocked(chunk, *found.roster);
}

int64_t ShardStore::ClockVersionLocked(const Chunk& chunk, const Roster& roster) {
  // Workers that left the job hold nobody's staleness back.
  int64_t min = INT64_MAX;
  for (size_t w = 0; w < chunk.applied_clocks.size(); ++w) {
    if (roster.active[w]) min = std::min(min, chunk.applied_clocks[w]);
  }
  if (min != INT64_MAX) return min;
  return chunk.applied_clocks.empty() ? 0 : *std::max_element(chunk.applied_clocks.begin(), chunk.applied_clocks.end());
}

bool ShardStore::ApplyLocked(const JobConfig& config, Chunk& chunk, absl::Span<const float> grad, float lr_scale,
                             float grad_scale, const std::vector<int>& workers, int64_t clock) {
  const int64_t step = chunk.gradient_updates + 1;
  // Finite gradients can still overflow the values (a huge one, a diverging job). When the bounds say the
  // result stays far below the largest float, the update is applied in place; otherwise on a kept copy's
  // watch, undone when anything came out non-finite.
  constexpr double kSafe = 1e36;
  const bool safe = config.rule.Bound(chunk.values_bound, chunk.state_bound, MaxAbs(grad), step, lr_scale,
                                      grad_scale) < kSafe;
  thread_local std::vector<float> before;  // per thread, reused
  const size_t n = chunk.values.size();
  if (!safe) {
    before.resize(n + chunk.state.size());
    std::memcpy(before.data(), chunk.values.data(), n * sizeof(float));
    if (!chunk.state.empty()) std::memcpy(before.data() + n, chunk.state.data(), chunk.state.size() * sizeof(float));
  }
  config.rule.Apply(absl::MakeSpan(chunk.values), grad, absl::MakeSpan(chunk.state), step, lr_scale, grad_scale);
  const float values_bound = MaxAbs(chunk.values);
  const float state_bound = MaxAbs(chunk.state);
  if (!std::isfinite(values_bound) || !std::isfinite(state_bound)) {
    CHECK(!safe) << "an update the bounds called safe overflowed";
    std::memcpy(chunk.values.data(), before.data(), n * sizeof(float));
    if (!chunk.state.empty()) std::memcpy(chunk.state.data(), before.data() + n, chunk.state.size() * sizeof(float));
    return false;
  }
  chunk.values_bound = values_bound;
  chunk.state_bound = state_bound;
  chunk.gradient_updates = step;
  ++chunk.version;
  for (int w : workers) chunk.applied_clocks[w] = std::max(chunk.applied_clocks[w], clock + 1);
  return true;
}

absl::StatusOr<ShardStore::Applied> ShardStore::PushInternal(const ChunkPush& request, const FloatPayload& payload,
                                                              const std::shared_ptr<ExchangeWaiter>* waiter) {
  TESSERA_ASSIGN_OR_RETURN(Found found, Find(request.address));
  Chunk& chunk = *found.chunk;
  const JobConfig& config = *found.config;
  const tessera::v1::JobSpec& job = config.job;
  const int worker = request.worker_id;
  if (worker < 0 || worker >= job.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker, " out of range: the job has ",
                                                   job.cluster().num_workers(), " workers"));
  }
  if (request.seq == 0) return absl::InvalidArgumentError("push seq must be >= 1");
  const Roster& roster = *found.roster;
  if (!roster.key_digest[worker].empty() &&
      !SecretsEqual(KeyDigest(request.member_key), roster.key_digest[worker])) {
    return absl::UnauthenticatedError(absl::StrCat(
        "push as worker ", worker, ": ", request.member_key.empty() ? "the call carried no member key" : "wrong member key"));
  }
  if (!roster.active[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker,
                                                      " is not in the job's cluster view (it was declared lost); "
                                                      "register again to rejoin"));
  }
  if (roster.incarnation[worker] != 0 && request.incarnation != roster.incarnation[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker, " incarnation ", request.incarnation,
                                                      " is not in the job: the rank is held by incarnation ",
                                                      roster.incarnation[worker]));
  }
  const std::string what = absl::StrCat("push to ", KeyName(request.address));
  if (!request.assign && request.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch_size must be > 0, got ", request.batch_size));
  }
  if (request.clock < 0 || request.clock > kMaxClock || request.read_clock_version < 0 ||
      request.read_clock_version > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": clock ", request.clock, " and read clock ",
                                                   request.read_clock_version, " must be within 0 .. ", kMaxClock));
  }

  // Copy (checking finiteness on the way) outside the chunk lock; nothing has changed if this fails. A chunk's
  // length never changes once created, so reading it needs no lock.
  size_t length;
  {
    absl::ReaderMutexLock lock(&chunk.mu);
    length = chunk.values.size();
  }
  std::shared_ptr<PooledBuffer> scratch = buffers_.Get(length * sizeof(float));
  absl::Span<float> values(reinterpret_cast<float*>(scratch->data()), length);
  // Nothing non-finite enters the values, gradient or assignment.
  TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(values, /*check_finite=*/true, what));

  Applied applied;
  PushOutcome& outcome = applied.outcome;
  int64_t staleness = -1;
  {
    absl::MutexLock lock(&chunk.mu);
    auto seq_it = chunk.last_seq.find(worker);
    if (seq_it != chunk.last_seq.end() && request.seq <= seq_it->second) {
      outcome.duplicate = true;
      // A retried exchange of a round that is still open waits for it like the original.
      applied.round_open = job.consistency().mode() == ConsistencySpec::SYNC && !request.assign &&
                           request.clock == chunk.version;
    } else if (request.assign) {
      std::copy(values.begin(), values.end(), chunk.values.begin());
      ++chunk.version;
      chunk.last_seq[worker] = request.seq;
    } else if (job.consistency().mode() == ConsistencySpec::SYNC) {
      const int64_t round = chunk.version;
      if (request.clock < round) {
        outcome.late = true;  // the round closed without it; never mixed into a later round
        applied.after_close = true;
        chunk.last_seq[worker] = request.seq;
      } else if (request.clock > round) {
        return absl::UnavailableError(absl::StrCat(what, ": round ", request.clock,
                                                   " is not open yet; the chunk is collecting round ", round));
      } else if (std::find(chunk.sync_workers.begin(), chunk.sync_workers.end(), worker) !=
                     chunk.sync_workers.end() ||
                 (!chunk.pending_batch.empty() && chunk.pending_batch[worker] > 0)) {
        return absl::AbortedError(absl::StrCat(what, ": worker ", worker, " already pushed round ", round,
                                               " with another seq"));
      } else if (!chunk.pending_batch.empty()) {
        // Backup workers: kept apart until the scheduler names the round's members.
        chunk.last_seq[worker] = request.seq;
        chunk.pending[worker].assign(values.begin(), values.end());
        chunk.pending_batch[worker] = request.batch_size;
        staleness = std::max<int64_t>(0, request.clock - request.read_clock_version);
        std::shared_ptr<const std::vector<int>> members = MembersOf(round);
        outcome.late = members != nullptr && !std::binary_search(members->begin(), members->end(), worker);
        if (RoundCompleteLocked(chunk, roster)) {
          applied.closed_waiters = CloseRoundLocked(config, chunk, &applied.dropped);
          OfferToSnapshotLocked(chunk);
        } else {
          applied.round_open = true;
        }
      } else {
        chunk.last_seq[worker] = request.seq;
        const float weight = static_cast<float>(request.batch_size);
        float* sum = chunk.sync_sum.data();
        // The round's first gradient starts the sum (no separate clearing pass); the mean's division happens
        // inside the update rule.
        if (chunk.sync_workers.empty()) {
          for (size_t i = 0; i < length; ++i) sum[i] = weight * values[i];
        } else {
          for (size_t i = 0; i < length; ++i) sum[i] += weight * values[i];
        }
        chunk.sync_weight += request.batch_size;
        chunk.sync_workers.push_back(worker);
        staleness = std::max<int64_t>(0, request.clock - request.read_clock_version);
        if (RoundCompleteLocked(chunk, roster)) {
          applied.closed_waiters = CloseRoundLocked(config, chunk);
          OfferToSnapshotLocked(chunk);
        } else {
          applied.round_open = true;
        }
      }
    } else {
      staleness = std::max<int64_t>(0, request.clock - request.read_clock_version);
      const float scale =
          job.consistency().staleness_aware_lr() ? 1.0f / static_cast<float>(std::max<int64_t>(1, staleness)) : 1.0f;
      if (!ApplyLocked(config, chunk, values, scale, 1.0f, {worker}, request.clock)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": the update would make values non-finite (a gradient "
                                                       "too large for the job's learning rate); nothing changed"));
      }
      chunk.last_seq[worker] = request.seq;
    }
    outcome.version = chunk.version;
    if (waiter != nullptr) {
      if (applied.round_open) {
        // Completed waiters (callers that gave up) are dropped here, so the list stays bounded.
        chunk.waiters.erase(std::remove_if(chunk.waiters.begin(), chunk.waiters.end(),
                                           [](const auto& w) { return w->completed(); }),
                            chunk.waiters.end());
        chunk.waiters.push_back(*waiter);
      } else {
        applied.values = SnapshotLocked(chunk, roster);
      }
    } else if (!applied.closed_waiters.empty()) {
      applied.values = SnapshotLocked(chunk, roster);
    }
  }

  absl::MutexLock lock(&counters_mu_);
  ++counters_.pushes;
  if (outcome.duplicate) ++counters_.duplicate_pushes;
  // A push for a round that had closed is counted here; one left out of a round (backup workers), as the
  // round closes.
  if (applied.after_close) ++counters_.late_pushes;
  counters_.late_pushes += applied.dropped;
  if (staleness >= 0) {
    counters_.staleness.Add(staleness);
    if (counters_.worker_staleness.size() <= static_cast<size_t>(worker)) counters_.worker_staleness.resize(worker + 1);
    counters_.worker_staleness[worker].Add(staleness);
  }
  return applied;
}

absl::StatusOr<PushOutcome> ShardStore::Push(const ChunkPush& request, const FloatPayload& values) {
  TESSERA_ASSIGN_OR_RETURN(Applied applied, PushInternal(request, values, nullptr));
  // A plain push that closed a round also answers the exchanges that waited for it.
  for (auto& w : applied.closed_waiters) w->Complete(applied.values);
  return applied.outcome;
}

void ShardStore::PushPull(const ChunkPush& request, const FloatPayload& values,
                          std::shared_ptr<ExchangeWaiter> waiter) {
  absl::StatusOr<Applied> applied = PushInternal(request, values, &waiter);
  if (!applied.ok()) {
    waiter->Complete(applied.status());
    return;
  }
  // Every exchange of a closed round shares one copy of the new values.
  for (auto& w : applied->closed_waiters) w->Complete(applied->values);
  if (!applied->round_open) waiter->Complete(std::move(applied->values));
}

void ShardStore::CancelWaiters(const absl::Status& why) {
  std::vector<std::shared_ptr<ExchangeWaiter>> waiting;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, chunk] : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
      for (auto& w : chunk->waiters) waiting.push_back(std::move(w));
      chunk->waiters.clear();
    }
  }
  for (auto& w : waiting) w->Complete(why);
}

uint64_t ShardStore::epoch() const {
  absl::ReaderMutexLock lock(&mu_);
  return epoch_;
}

std::string ShardStore::job_name() const {
  absl::ReaderMutexLock lock(&mu_);
  return config_ ? config_->job.name() : "";
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
      stats.set_optimizer_bytes(stats.optimizer_bytes() + static_cast<int64_t>(chunk->state.size() * sizeof(float)));
    }
    stats.set_chunks(static_cast<int64_t>(chunks_.size()));
    stats.set_updates_applied(updates);
  }
  absl::MutexLock lock(&counters_mu_);
  stats.set_pushes(counters_.pushes);
  stats.set_duplicate_pushes(counters_.duplicate_pushes);
  stats.set_late_pushes(counters_.late_pushes);
  *stats.mutable_staleness() = counters_.staleness.ToProto();
  for (const StalenessHistogram& h : counters_.worker_staleness) *stats.add_worker_staleness() = h.ToProto();
  return stats;
}

}  // namespace tessera

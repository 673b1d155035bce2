#include "server/shard_store.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/synchronization/notification.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/param_init.h"
#include "common/job_spec.h"
#include "common/security.h"
#include "common/shard_map.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/wire_limits.h"
#include "glog/logging.h"
#include "server/replica_auth.h"
#include "google/protobuf/util/message_differencer.h"

namespace tessera {

namespace {
std::string KeyName(const ChunkAddress& a) { return absl::StrCat(std::string(a.param), "/", a.index); }

// A chunk state from a checkpoint or a primary fits `chunk` and holds finite values only.
absl::Status CheckChunkState(const tessera::v1::ChunkState& state, const Chunk& chunk, const std::string& what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk.mu) {
  if (state.values().size() != chunk.values.size() * sizeof(float) ||
      state.optimizer_state().size() != chunk.state.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has another size than the job's"));
  }
  // Nothing non-finite enters the values, a checkpoint's or a primary's included.
  for (const std::string* bytes : {&state.values(), &state.optimizer_state()}) {
    std::vector<float> floats(bytes->size() / sizeof(float));
    if (!floats.empty()) std::memcpy(floats.data(), bytes->data(), floats.size() * sizeof(float));
    TESSERA_RETURN_IF_ERROR(CheckFinite(floats, what));
  }
  return absl::OkStatus();
}

absl::Status Moved(uint64_t epoch) {
  return absl::UnavailableError(absl::StrCat("the chunk was restored from a checkpoint or moved to another ",
                                             "server (cluster view epoch ", epoch, "); ask again"));
}
}  // namespace

ShardStore::~ShardStore() {
  absl::MutexLock lock(&ships_mu_);
  stopping_ = true;
  ships_mu_.Await(absl::Condition(
      +[](int* in_flight) { return *in_flight == 0; }, &ships_in_flight_));
}

absl::Status ShardStore::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
                                const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all) {
  // Rounds the new view closes and exchanges of rounds a rollback dropped, answered once no lock is held.
  ClosedRounds closed;
  std::vector<std::shared_ptr<ExchangeWaiter>> dropped;
  Released released;
  std::vector<Chunk*> to_ship;
  absl::Status status = AdoptView(map, job, server_id, restore, restore_all, closed, dropped, released, to_ship);
  AnswerClosedRounds(closed);
  for (auto& w : dropped) w->Complete(Moved(map.epoch()));
  for (auto& [done, why] : released) done(why);
  for (Chunk* chunk : to_ship) Ship(*chunk);
  return status;
}

void ShardStore::AnswerClosedRounds(ClosedRounds& closed) {
  for (ClosedRound& round : closed) {
    AfterApplied(*round.chunk, round.values.version,
                 [waiters = std::move(round.waiters), values = round.values](const absl::Status& held) {
                   for (const auto& w : waiters) {
                     if (held.ok()) {
                       w->Complete(values);
                     } else {
                       w->Complete(held);
                     }
                   }
                 });
  }
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
      *out.add_chunks() = ChunkStateLocked(*chunk);
    }
    return out;
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<tessera::v1::ChunkState> states,
                           cut_.Take(chunks, at_version, deadline, cancelled, out.server_id()));
  for (auto& state : states) *out.add_chunks() = std::move(state);
  return out;
}

absl::Status ShardStore::AdoptView(
    const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
    const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all,
    ClosedRounds& closed,
    std::vector<std::shared_ptr<ExchangeWaiter>>& dropped, Released& released, std::vector<Chunk*>& to_ship) {
  TESSERA_RETURN_IF_ERROR(ValidateShardMap(map, job));
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
  if (job.replication().backups() > 0 && replicas_sender_ == nullptr) {
    return absl::FailedPreconditionError("a job with replication needs a server that can reach its peers");
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
    if (absl::Status fits = CheckChunkState(state, chunk, absl::StrCat("checkpoint chunk ", key.first, "/", key.second));
        !fits.ok()) {
      return absl::FailedPreconditionError(fits.message());
    }
    RestoreChunkLocked(state, keep_seq, chunk, dropped);
    return absl::OkStatus();
  };
  for (const auto& placement : map.chunks()) {
    const bool primary = placement.server_id() == server_id_;
    const bool backup = std::find(placement.backup_server_ids().begin(), placement.backup_server_ids().end(),
                                  server_id_) != placement.backup_server_ids().end();
    if (!primary && !backup) continue;
    auto key = std::make_pair(placement.param(), placement.index());
    auto& home = primary ? chunks_ : replicas_;
    auto& other = primary ? replicas_ : chunks_;
    if (home.count(key) == 0 && other.count(key) != 0) {
      // A backup taking over (its state is the chunk's), or a primary becoming a backup.
      home[key] = std::move(other[key]);
      other.erase(key);
      Chunk& chunk = *home[key];
      absl::MutexLock chunk_lock(&chunk.mu);
      for (auto& w : TakeWaitersLocked(chunk)) dropped.push_back(std::move(w));
      if (primary && !chunk.replication.filled && !(restore != nullptr && restore_all)) {
        // Its primary was lost before it filled this copy (two servers lost within moments): what it holds is
        // not the chunk. Requests for it fail loudly rather than train on initial values.
        chunk.replication.lost = true;
        LOG(ERROR) << "chunk " << key.first << "/" << key.second << ": made primary of a copy its primary never "
                   << "filled; the chunk's state is lost (restore the job from a checkpoint)";
      }
      chunk.replication.filled = true;
    }
    if (home.count(key) != 0) {
      Chunk& chunk = *home[key];
      absl::MutexLock chunk_lock(&chunk.mu);
      if (restore != nullptr && restore_all) {
        TESSERA_RETURN_IF_ERROR(restore_into(key, chunk));
        chunk.replication.filled = true;
        chunk.replication.lost = false;
      }
    } else {
      auto spec = std::find_if(map.params().begin(), map.params().end(),
                               [&](const auto& p) { return p.name() == placement.param(); });
      if (spec == map.params().end()) {
        return absl::InvalidArgumentError(absl::StrCat("shard map places chunk ", placement.param(), "/",
                                                       placement.index(), " but declares no such parameter"));
      }
      auto chunk = std::make_unique<Chunk>(placement.param(), placement.index(), placement.length(), slots);
      chunk->module_state = spec->state();
      absl::MutexLock chunk_lock(&chunk->mu);
      chunk->applied_clocks.assign(workers, 0);
      config_->policy->PrepareChunkLocked(*chunk, workers);
      chunk->replication.filled = restore != nullptr;  // a backup's copy from a checkpoint is the primary's
      if (restore != nullptr) {
        TESSERA_RETURN_IF_ERROR(restore_into(key, *chunk));
      } else {
        // A new job's backups start as their primaries do (and are filled by them at once); a later backup is
        // filled by its primary.
        FillInit(spec->init(), spec->name(), placement.offset(), absl::MakeSpan(chunk->values));
      }
      home[key] = std::move(chunk);
    }
    Chunk& chunk = *home[key];
    absl::MutexLock chunk_lock(&chunk.mu);
    ChunkReplication& replication = chunk.replication;
    if (backup) {
      replication.primary = placement.server_id();
      replication.backups.clear();
      for (auto& [version, done] : replication.waiting) released.emplace_back(std::move(done), Moved(map.epoch()));
      replication.waiting.clear();
      continue;
    }
    replication.primary = server_id_;
    const std::vector<int> backups(placement.backup_server_ids().begin(), placement.backup_server_ids().end());
    if (backups != replication.backups || (restore != nullptr && restore_all)) {
      replication.backups = backups;
      ++replication.generation;
      replication.replicated_version = -1;  // new backups (or new state): hand it over whole
      replication.log_base = -1;
      replication.log.clear();
      replication.log_bytes = 0;
    }
    if (replication.backups.empty()) {
      // Nothing to wait for any more (the job is down to one copy).
      for (auto& [version, done] : replication.waiting) released.emplace_back(std::move(done), absl::OkStatus());
      replication.waiting.clear();
    } else if (replication.replicated_version < 0) {
      to_ship.push_back(&chunk);
    }
  }
  // Chunks the view has moved to other servers leave this one. They are retired, not freed: a request that
  // found one before this view keeps a valid object (what it does there no longer counts).
  std::set<std::pair<std::string, int>> here;
  for (const auto& placement : map.chunks()) {
    const auto& b = placement.backup_server_ids();
    if (placement.server_id() == server_id_ || std::find(b.begin(), b.end(), server_id_) != b.end()) {
      here.emplace(placement.param(), placement.index());
    }
  }
  for (auto* held : {&chunks_, &replicas_}) {
    for (auto it = held->begin(); it != held->end();) {
      if (here.count(it->first) != 0) {
        ++it;
        continue;
      }
      {
        absl::MutexLock chunk_lock(&it->second->mu);
        for (auto& w : TakeWaitersLocked(*it->second)) dropped.push_back(std::move(w));
        ChunkReplication& replication = it->second->replication;
        for (auto& [version, done] : replication.waiting) released.emplace_back(std::move(done), Moved(map.epoch()));
        replication.waiting.clear();
        replication.backups.clear();
      }
      retired_.push_back(std::move(it->second));
      it = held->erase(it);
    }
  }
  servers_.clear();
  for (const auto& server : map.servers()) {
    servers_[server.id()] = Peer{server.address(), server.replication_key(), server.incarnation()};
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
  for (auto* held : {&chunks_, &replicas_}) {
   for (auto& [key, chunk] : *held) {
    absl::MutexLock chunk_lock(&chunk->mu);
    for (int w : renewed) {
      chunk->last_seq.erase(w);
      chunk->applied_clocks[w] = std::max(chunk->applied_clocks[w], roster->joined_clock[w]);
    }
   }
  }
  // A worker that left may have been the last one a round waited for.
  CloseCompleteRounds(*config_, *roster, closed);
  roster_ = std::move(roster);
  epoch_ = map.epoch();
  view_ = map;
  return absl::OkStatus();
}

void ShardStore::CloseCompleteRounds(const JobConfig& config, const Roster& roster, ClosedRounds& closed) {
  int64_t dropped = 0;
  for (auto& [key, chunk] : chunks_) {
    absl::MutexLock chunk_lock(&chunk->mu);
    std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
    double sq_norm = 0;
    if (config.policy->CloseNormIfCompleteLocked(*chunk, roster, sq_norm, waiters)) {
      closed.push_back(ClosedRound{chunk.get(), std::move(waiters), NormLocked(*chunk, roster, sq_norm)});
      waiters.clear();
    }
    if (!config.policy->CloseIfCompleteLocked(*chunk, roster, dropped, waiters)) continue;
    cut_.OfferLocked(*chunk);
    closed.push_back(
        ClosedRound{chunk.get(), std::move(waiters), ValuesLocked(*chunk, roster, config.job.wire().values())});
  }
  if (dropped > 0) {
    absl::MutexLock counters_lock(&counters_mu_);
    counters_.late_pushes += dropped;
  }
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
  ClosedRounds closed;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (config_ == nullptr || roster_ == nullptr || !config_->policy->decides_rounds()) return absl::OkStatus();
    std::vector<std::pair<int64_t, std::vector<int>>> rounds;
    for (const auto& round : request.rounds()) {
      rounds.emplace_back(round.round(), std::vector<int>(round.workers().begin(), round.workers().end()));
    }
    config_->policy->Decide(std::move(rounds));
    CloseCompleteRounds(*config_, *roster_, closed);
  }
  AnswerClosedRounds(closed);
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
    // With the server's epoch: the caller sees this server answered (it is not to be reported as unreachable).
    absl::Status status = absl::UnavailableError(absl::StrCat("server ", server_id_, " is at shard map epoch ", epoch_,
                                                              ", request has ", address.epoch,
                                                              "; its assignment is on the way"));
    SetCurrentEpoch(status, epoch_);
    return status;
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
  {
    absl::MutexLock chunk_lock(&it->second->mu);
    if (it->second->replication.lost) {
      return absl::DataLossError(absl::StrCat("chunk '", KeyName(address), "' on server ", server_id_,
                                              " lost its state: its backup here was made primary before its old "
                                              "primary filled it (two servers lost within moments); resume the job "
                                              "from a checkpoint"));
    }
  }
  return Found{it->second.get(), config_.get(), roster_};
}

ChunkValues ShardStore::NormLocked(const Chunk& chunk, const Roster& roster, double sq_norm) const {
  ChunkValues answer;
  answer.version = chunk.version;
  answer.clock_version = ClockVersionLocked(chunk, roster);
  answer.round_sq_norm = sq_norm;
  return answer;
}

ChunkValues ShardStore::ValuesLocked(const Chunk& chunk, const Roster& roster, WirePrecision precision) const {
  ChunkValues values;
  values.version = chunk.version;
  values.clock_version = ClockVersionLocked(chunk, roster);
  values.precision = precision;
  values.skipped = chunk.last_round_skipped;
  values.length = chunk.values.size() * BytesPerValue(precision);
  std::shared_ptr<PooledBuffer> buffer = buffers_.Get(values.length);
  EncodeValues(chunk.values, precision, buffer->data());
  values.bytes = std::move(buffer);
  return values;
}

absl::StatusOr<ChunkValues> ShardStore::Pull(const ChunkPull& request) const {
  if (!tessera::v1::WireSpec::Precision_IsValid(request.precision)) {
    return absl::InvalidArgumentError(absl::StrCat("pull in unknown precision ", static_cast<int>(request.precision)));
  }
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
    unchanged.skipped = chunk.last_round_skipped;
    return unchanged;
  }
  return ValuesLocked(chunk, *found.roster, request.precision);
}

absl::Status ShardStore::CheckMemberKey(int worker, std::string_view key) const {
  std::shared_ptr<const Roster> roster;
  {
    absl::ReaderMutexLock lock(&mu_);
    roster = roster_;
  }
  if (roster == nullptr) return absl::UnavailableError("this server has no cluster view yet");
  if (worker < 0 || static_cast<size_t>(worker) >= roster->key_digest.size()) {
    return absl::InvalidArgumentError(absl::StrCat("worker id ", worker, " out of range: the job has ",
                                                   roster->key_digest.size(), " workers"));
  }
  if (!roster->key_digest[worker].empty() && !SecretsEqual(KeyDigest(absl::string_view(key.data(), key.size())), roster->key_digest[worker])) {
    return absl::UnauthenticatedError(
        absl::StrCat("worker ", worker, ": ", key.empty() ? "no member key" : "wrong member key"));
  }
  return absl::OkStatus();
}

tessera::v1::JobSpec ShardStore::job() const {
  absl::ReaderMutexLock lock(&mu_);
  return config_ ? config_->job : tessera::v1::JobSpec();
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
  const Roster& roster = *found.roster;
  if (!roster.key_digest[worker].empty() &&
      !SecretsEqual(KeyDigest(request.member_key), roster.key_digest[worker])) {
    return absl::UnauthenticatedError(absl::StrCat(
        "push as worker ", worker, ": ", request.member_key.empty() ? "the call carried no member key" : "wrong member key"));
  }
  if (request.seq == 0 || request.seq > static_cast<uint64_t>(kMaxUpdateCount)) {
    return absl::InvalidArgumentError(absl::StrCat("push seq ", request.seq, " is not within 1 .. ", kMaxUpdateCount));
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
  if (request.assign && (payload.encoding().sparse || payload.encoding().precision != tessera::v1::WireSpec::FP32)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": an assignment carries dense float32 values, got ",
                                                   PrecisionName(payload.encoding().precision),
                                                   payload.encoding().sparse ? " top-k entries" : ""));
  }
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
  // Decoded where the payload lies when it has room, else into a buffer of its own.
  std::shared_ptr<PooledBuffer> scratch;
  float* room = payload.Room(length);
  if (room == nullptr) {
    scratch = buffers_.Get(length * sizeof(float));
    room = reinterpret_cast<float*>(scratch->data());
  }
  absl::Span<float> values(room, length);
  // Nothing non-finite enters the values, gradient or assignment.
  TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(values, /*check_finite=*/true, what));

  Applied applied;
  applied.chunk = &chunk;
  PushOutcome& outcome = applied.outcome;
  Admission& admission = applied.admission;
  {
    absl::MutexLock lock(&chunk.mu);
    auto seq_it = chunk.last_seq.find(worker);
    if (request.norm_only) {
      // Changes no state, so it takes no sequence number: a retry finds its worker in the round, or the round
      // closed with its norm kept.
      if (request.assign || chunk.module_state) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": a norm-only push is a gradient of a trained parameter"));
      }
      TESSERA_ASSIGN_OR_RETURN(admission, config.policy->AdmitNormLocked(request, values, chunk, roster, what));
      outcome.version = chunk.version;
      if (waiter != nullptr && admission.round_open) {
        chunk.norm_round.Park(*waiter);
      } else {
        applied.values = NormLocked(chunk, roster, admission.round_sq_norm);
      }
    } else if (seq_it != chunk.last_seq.end() && request.seq <= seq_it->second) {
      outcome.duplicate = true;
      // A retried exchange of a round that is still open waits for it like the original.
      admission.round_open = !request.assign && config.policy->DuplicateWaitsLocked(request, chunk);
    } else if (request.assign) {
      std::copy(values.begin(), values.end(), chunk.values.begin());
      ++chunk.version;
      ++chunk.assignments;
      chunk.last_seq[worker] = request.seq;
      if (!chunk.replication.backups.empty()) LogUpdateLocked(chunk, true, values, 1.0f, 1.0f, {}, 0);
    } else if (chunk.module_state) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", chunk.key.first, "' is module state, set by assignments only, not gradients"));
    } else {
      TESSERA_ASSIGN_OR_RETURN(admission, config.policy->AdmitLocked(request, values, chunk, roster, what));
      chunk.last_seq[worker] = request.seq;
      outcome.late = admission.late;
      if (admission.closed) cut_.OfferLocked(chunk);
    }
    if (!request.norm_only) {
      outcome.version = chunk.version;
      if (waiter != nullptr && admission.round_open) {
        chunk.round.Park(*waiter);
      } else if (waiter != nullptr || !admission.closed_waiters.empty()) {
        applied.values = ValuesLocked(chunk, roster, job.wire().values());
      }
    }
  }

  absl::MutexLock lock(&counters_mu_);
  ++counters_.pushes;
  counters_.push_bytes += static_cast<int64_t>(payload.size());
  if (outcome.duplicate) ++counters_.duplicate_pushes;
  // A push for a round that had closed is counted here; one left out of a round (backup workers), as the
  // round closes.
  if (admission.after_close) ++counters_.late_pushes;
  counters_.late_pushes += admission.dropped;
  if (admission.staleness >= 0) {
    counters_.staleness.Add(admission.staleness);
    if (counters_.worker_staleness.size() <= static_cast<size_t>(worker)) counters_.worker_staleness.resize(worker + 1);
    counters_.worker_staleness[worker].Add(admission.staleness);
  }
  return applied;
}

void ShardStore::Push(const ChunkPush& request, const FloatPayload& values, PushDone done) {
  absl::StatusOr<Applied> applied = PushInternal(request, values, nullptr);
  if (!applied.ok()) {
    done(applied.status());
    return;
  }
  // A plain push that closed a round also answers the exchanges that waited for it.
  AfterApplied(*applied->chunk, applied->outcome.version,
               [done = std::move(done), outcome = applied->outcome,
                waiters = std::move(applied->admission.closed_waiters),
                after = std::move(applied->values)](const absl::Status& held) {
                 for (const auto& w : waiters) {
                   if (held.ok()) {
                     w->Complete(after);
                   } else {
                     w->Complete(held);
                   }
                 }
                 if (held.ok()) {
                   done(outcome);
                 } else {
                   done(held);
                 }
               });
}

absl::StatusOr<PushOutcome> ShardStore::Push(const ChunkPush& request, const FloatPayload& values) {
  absl::Notification answered;
  absl::StatusOr<PushOutcome> result;
  Push(request, values, [&](absl::StatusOr<PushOutcome> outcome) {
    result = std::move(outcome);
    answered.Notify();
  });
  answered.WaitForNotification();
  return result;
}

void ShardStore::PushPull(const ChunkPush& request, const FloatPayload& values,
                          std::shared_ptr<ExchangeWaiter> waiter) {
  absl::StatusOr<Applied> applied = PushInternal(request, values, &waiter);
  if (!applied.ok()) {
    waiter->Complete(applied.status());
    return;
  }
  const bool parked = applied->admission.round_open;
  if (parked && applied->admission.closed_waiters.empty()) return;  // the push that closes the round answers it
  // Every exchange of a closed round shares one copy of the new values, sent once the backups hold them.
  std::vector<std::shared_ptr<ExchangeWaiter>> waiters = std::move(applied->admission.closed_waiters);
  if (!parked) waiters.push_back(std::move(waiter));
  AfterApplied(*applied->chunk, applied->outcome.version,
               [waiters = std::move(waiters), after = std::move(applied->values)](const absl::Status& held) {
                 for (const auto& w : waiters) {
                   if (held.ok()) {
                     w->Complete(after);
                   } else {
                     w->Complete(held);
                   }
                 }
               });
}

absl::StatusOr<int64_t> ShardStore::TakeReplica(const tessera::v1::ReplicateRequest& request,
                                                std::string_view signature) {
  const tessera::v1::ChunkState& state = request.state();
  const std::string name = absl::StrCat(state.param().substr(0, kMaxNameBytes), "/", state.index());
  // Hashed before any lock: the signature covers the whole request, state included.
  const std::string digest = ReplicateDigest(request);
  absl::ReaderMutexLock lock(&mu_);
  // A view still on its way is ABORTED (try again), not UNAVAILABLE: this server answers.
  if (config_ == nullptr) return absl::AbortedError("this server has no cluster view yet");
  TESSERA_RETURN_IF_ERROR(CheckReplicateRequest(request, config_->job.cluster().num_servers(),
                                                config_->job.cluster().num_workers()));
  const uint64_t epoch = epoch_;
  const int self = server_id_;
  // The epoch is the scheduler's to give: a request from a newer view waits for that view to come here.
  if (request.epoch() > epoch) {
    return absl::AbortedError(absl::StrCat("server ", self, " is at cluster view epoch ", epoch,
                                           ", the primary at ", request.epoch(), ": its view is on its way"));
  }
  auto not_backup = [&](const std::string& why) -> absl::Status {
    return absl::FailedPreconditionError(absl::StrCat("server ", self, " at cluster view epoch ", epoch, ": ", why));
  };
  auto sender = servers_.find(request.server_id());
  if (sender == servers_.end()) return not_backup(absl::StrCat("server ", request.server_id(), " is not in its view"));
  TESSERA_RETURN_IF_ERROR(CheckSignedLocked(sender->second, digest, signature,
                                            absl::StrCat("state of chunk ", name, " as server ", request.server_id())));
  auto it = replicas_.find({state.param(), state.index()});
  if (it == replicas_.end()) return not_backup(absl::StrCat("it does not back up chunk ", name));
  Chunk& chunk = *it->second;
  {
    absl::MutexLock chunk_lock(&chunk.mu);
    if (chunk.replication.primary != request.server_id()) {
      return not_backup(absl::StrCat("chunk ", name, "'s primary is server ", chunk.replication.primary, ", not ",
                                     request.server_id()));
    }
    // States of one primary come in order; one from an older view (a primary since replaced) is ignored.
    if (request.epoch() < chunk.replication.taken_epoch ||
        (request.epoch() == chunk.replication.taken_epoch && state.version() < chunk.version)) {
      return chunk.version;
    }
    if (request.updates_size() > 0) {
      TESSERA_RETURN_IF_ERROR(ApplyReplicatedLocked(config_->rule, request.updates(), state, chunk));
    } else {
      TESSERA_RETURN_IF_ERROR(CheckChunkState(state, chunk, absl::StrCat("state of chunk ", name)));
      std::vector<std::shared_ptr<ExchangeWaiter>> none;
      RestoreChunkLocked(state, std::vector<bool>(config_->job.cluster().num_workers(), true), chunk, none);
    }
    chunk.replication.taken_epoch = request.epoch();
    chunk.replication.filled = true;
  }
  size_t bytes = state.values().size() + state.optimizer_state().size();
  for (const auto& u : request.updates()) bytes += u.values().size();
  absl::MutexLock counters_lock(&counters_mu_);
  counters_.replica_bytes_received += static_cast<int64_t>(bytes);
  return state.version();
}

absl::Status ShardStore::CheckSignedLocked(const Peer& primary, const std::string& digest, std::string_view signature,
                                           const std::string& what) const {
  auto own = servers_.find(server_id_);
  const uint64_t incarnation = own == servers_.end() ? 0 : own->second.incarnation;
  if (!primary.replication_key.empty() &&
      VerifyReplicaSignature(primary.replication_key, ReplicateProof(digest, server_id_, incarnation),
                             absl::string_view(signature.data(), signature.size()))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(what, ": ",
                                                 primary.replication_key.empty()
                                                     ? "the view has no replication key for that server"
                                                 : signature.empty() ? "the call is not signed"
                                                                     : "not signed by that server for this one"));
}

void ShardStore::AfterApplied(Chunk& chunk, int64_t version, std::function<void(absl::Status)> done) {
  {
    absl::MutexLock chunk_lock(&chunk.mu);
    ChunkReplication& replication = chunk.replication;
    if (!replication.backups.empty() && version > replication.replicated_version) {
      replication.waiting.emplace_back(version, std::move(done));
      done = nullptr;
    }
  }
  if (done) {
    done(absl::OkStatus());
    return;
  }
  Ship(chunk);
}

void ShardStore::Ship(Chunk& chunk) {
  auto request = std::make_shared<tessera::v1::ReplicateRequest>();
  std::vector<ReplicaTarget> targets;
  uint64_t generation;
  {
    absl::MutexLock lock(&ships_mu_);
    if (stopping_) return;
    ++ships_in_flight_;
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    absl::MutexLock chunk_lock(&chunk.mu);
    ChunkReplication& replication = chunk.replication;
    const bool wanted = !replication.backups.empty() && !replication.shipping &&
                        (replication.replicated_version < 0 || !replication.waiting.empty());
    if (wanted) {
      replication.shipping = true;
      generation = replication.generation;
      request->set_epoch(epoch_);
      request->set_server_id(server_id_);
      // The updates since the version every backup holds, when they are kept; otherwise the whole state, from
      // which the log starts again.
      auto& log = replication.log;
      const bool in_step = replication.replicated_version >= 0 && replication.log_base >= 0 &&
                           replication.log_base <= replication.replicated_version &&
                           (log.empty() ? replication.log_base : log.back().version()) == chunk.version;
      if (in_step) {
        for (const auto& u : log) {
          if (u.version() > replication.replicated_version) *request->add_updates() = u;
        }
        *request->mutable_state() = ReplicaStateLocked(chunk, /*values=*/false);
      } else {
        *request->mutable_state() = ReplicaStateLocked(chunk);
        replication.log_base = chunk.version;
        log.clear();
        replication.log_bytes = 0;
      }
      for (int b : replication.backups) {
        auto peer = servers_.find(b);
        targets.push_back(peer == servers_.end() ? ReplicaTarget{"", b, 0}
                                                 : ReplicaTarget{peer->second.address, b, peer->second.incarnation});
      }
    }
  }
  if (targets.empty()) {
    absl::MutexLock lock(&ships_mu_);
    --ships_in_flight_;
    return;
  }
  {
    absl::MutexLock counters_lock(&counters_mu_);
    size_t bytes = request->state().values().size() + request->state().optimizer_state().size();
    for (const auto& u : request->updates()) bytes += u.values().size();
    counters_.replica_bytes_sent += static_cast<int64_t>(targets.size() * bytes);
  }
  const int64_t version = request->state().version();
  struct Pending {
    absl::Mutex mu;
    size_t left;
    absl::Status status;
    int failed = -1;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = targets.size();
  for (const ReplicaTarget& target : targets) {
    // A backup holds the hand-over only when it says it holds the very version sent (one that ignored it, or
    // holds another state, is sent the whole state again).
    auto one_done = [this, &chunk, pending, generation, version, id = target.server_id](absl::StatusOr<int64_t> held) {
      absl::Status status = held.status();
      if (held.ok() && *held != version) {
        status = absl::FailedPreconditionError(absl::StrCat("backup server ", id, " holds version ", *held, " of chunk ",
                                                            chunk.key.first, "/", chunk.key.second, "; ", version,
                                                            " was sent"));
      }
      absl::Status all;
      int failed;
      {
        absl::MutexLock lock(&pending->mu);
        if (!status.ok() && pending->status.ok()) {
          pending->status = status;
          pending->failed = id;
        }
        if (--pending->left > 0) return;
        all = pending->status;
        failed = pending->failed;
      }
      Shipped(chunk, generation, version, all, failed);
      absl::MutexLock lock(&ships_mu_);
      --ships_in_flight_;
    };
    if (target.address.empty()) {
      one_done(absl::UnavailableError("a backup is not in this server's view"));
    } else {
      replicas_sender_->Send(target, request, std::move(one_done));
    }
  }
}

void ShardStore::Shipped(Chunk& chunk, uint64_t generation, int64_t version, const absl::Status& status,
                         int failed) {
  std::vector<std::function<void(absl::Status)>> ready;
  bool retry = false;
  {
    absl::MutexLock chunk_lock(&chunk.mu);
    ChunkReplication& replication = chunk.replication;
    replication.shipping = false;
    if (generation == replication.generation) {
      if (status.ok()) {
        replication.replicated_version = std::max(replication.replicated_version, version);
        // What every backup holds leaves the log.
        auto& log = replication.log;
        const int64_t replicated = replication.replicated_version;
        auto held = std::find_if(log.begin(), log.end(), [replicated](const auto& u) {
          return u.version() > replicated;
        });
        for (auto it = log.begin(); it != held; ++it) replication.log_bytes -= it->values().size();
        log.erase(log.begin(), held);
        if (replication.log_base >= 0) replication.log_base = std::max(replication.log_base, replication.replicated_version);
      } else {
        retry = true;
        // A backup out of step (or refusing): the next hand-over is the whole state.
        if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) replication.replicated_version = -1;
        LOG_EVERY_N(WARNING, 100) << "chunk " << chunk.key.first << "/" << chunk.key.second
                                    << ": a backup did not take its state, trying again: " << status;
      }
    }
    auto& waiting = replication.waiting;
    const int64_t replicated = replication.replicated_version;
    auto unheld = std::partition(waiting.begin(), waiting.end(), [replicated](const auto& w) {
      return w.first > replicated;
    });
    for (auto it = unheld; it != waiting.end(); ++it) ready.push_back(std::move(it->second));
    waiting.erase(unheld, waiting.end());
  }
  for (auto& done : ready) done(absl::OkStatus());
  if (retry) {
    ShipLater(&chunk, failed, status);
  } else {
    Ship(chunk);  // updates that came meanwhile, or backups that changed meanwhile
  }
}

void ShardStore::ShipLater(Chunk* chunk, int failed, const absl::Status& why) {
  {
    absl::MutexLock lock(&retry_mu_);
    retry_.insert(chunk);
    if (failed >= 0 && (absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why))) unreachable_[failed] = why;
    if (retry_scheduled_) return;
    retry_scheduled_ = true;
  }
  retries_.Submit([this] {
    std::map<int, absl::Status> unreachable;
    {
      absl::MutexLock lock(&retry_mu_);
      const absl::Time now = absl::Now();
      for (auto& [id, why] : unreachable_) {
        absl::Time& last = reported_[id];
        if (now - last < absl::Seconds(1)) continue;
        last = now;
        unreachable[id] = why;
      }
      unreachable_.clear();
    }
    if (on_unreachable_) {
      for (const auto& [id, why] : unreachable) {
        uint64_t incarnation = 0;
        {
          absl::ReaderMutexLock lock(&mu_);
          if (auto peer = servers_.find(id); peer != servers_.end()) incarnation = peer->second.incarnation;
        }
        on_unreachable_(id, incarnation, why);
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
    std::set<Chunk*> chunks;
    {
      absl::MutexLock lock(&retry_mu_);
      chunks.swap(retry_);
      retry_scheduled_ = false;
    }
    for (Chunk* chunk : chunks) Ship(*chunk);
  });
}

void ShardStore::CancelWaiters(const absl::Status& why) {
  std::vector<std::shared_ptr<ExchangeWaiter>> waiting;
  std::vector<std::function<void(absl::Status)>> held;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, chunk] : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
      for (auto& w : TakeWaitersLocked(*chunk)) waiting.push_back(std::move(w));
      for (auto& [version, done] : chunk->replication.waiting) held.push_back(std::move(done));
      chunk->replication.waiting.clear();
    }
  }
  for (auto& w : waiting) w->Complete(why);
  for (auto& done : held) done(why);
}

tessera::v1::ShardMap ShardStore::view() const {
  absl::ReaderMutexLock lock(&mu_);
  return view_;
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
    int64_t unfilled = 0;
    for (const auto& [key, chunk] : chunks_) {
      absl::MutexLock chunk_lock(&chunk->mu);
      unfilled += !chunk->replication.backups.empty() && chunk->replication.replicated_version < 0;
    }
    stats.set_unfilled_chunks(unfilled);
    stats.set_backup_chunks(static_cast<int64_t>(replicas_.size()));
    stats.set_updates_applied(updates);
  }
  absl::MutexLock lock(&counters_mu_);
  stats.set_pushes(counters_.pushes);
  stats.set_duplicate_pushes(counters_.duplicate_pushes);
  stats.set_late_pushes(counters_.late_pushes);
  *stats.mutable_staleness() = counters_.staleness.ToProto();
  for (const StalenessHistogram& h : counters_.worker_staleness) *stats.add_worker_staleness() = h.ToProto();
  stats.set_push_bytes(counters_.push_bytes);
  stats.set_replica_bytes_sent(counters_.replica_bytes_sent);
  stats.set_replica_bytes_received(counters_.replica_bytes_received);
  return stats;
}

}  // namespace tessera

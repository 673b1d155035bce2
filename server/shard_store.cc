#include "server/shard_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/model/job_spec.h"
#include "common/rpc/security.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "common/base/tensor_codec.h"
#include "common/model/wire_limits.h"
#include "server/request_checks.h"

namespace tessera {

namespace {
std::string KeyName(const ChunkAddress& a) { return absl::StrCat(std::string(a.param), "/", a.index); }

// Answers exchanges with `values` once the backups hold them (`held` OK), with `held`'s error otherwise.
void AnswerOnceHeld(const std::vector<std::shared_ptr<ExchangeWaiter>>& waiters, const ChunkValues& values,
                    const absl::Status& held) {
  for (const auto& w : waiters) {
    if (held.ok()) {
      w->Complete(values);
    } else {
      w->Complete(held);
    }
  }
}
}  // namespace

absl::Status ShardStore::Assign(const tessera::v1::ShardMap& map, const tessera::v1::JobSpec& job, int server_id,
                                const std::vector<tessera::v1::ShardCheckpoint>* restore, bool restore_all) {
  TESSERA_RETURN_IF_ERROR(ValidateShardMap(map, job));
  if (job.replication().backups() > 0 && !shipper_.can_ship()) {
    return absl::FailedPreconditionError("a job with replication needs a server that can reach its peers");
  }
  // What the view changes is answered once no lock is held: the rounds it closes, exchanges and callers of
  // chunks that moved or were restored, and hand-overs to new backups.
  if (restore != nullptr) {
    // Restored slots' versions go back: no delta may apply over a full checkpoint written before.
    absl::MutexLock lock(&full_mu_);
    last_full_path_.clear();
    last_full_versions_.clear();
  }
  ViewAdoption adoption(state_, map, job, restore, restore_all);
  ClosedRounds closed;
  RowsTaken rows;
  absl::Status status = AdoptView(adoption, server_id, restore_all, closed, rows);
  AnswerClosedRounds(closed);
  rows_.Finish(rows);
  ViewAdoption::Results& results = adoption.results();
  for (auto& w : results.dropped) w->Complete(MovedAway(map.epoch()));
  for (auto& [done, why] : results.released) done(why);
  for (Unit* unit : results.to_ship) shipper_.Ship(*unit);
  return status;
}

absl::Status ShardStore::AdoptView(ViewAdoption& adoption, int server_id, bool restore_all, ClosedRounds& closed,
                                   RowsTaken& rows) {
  absl::MutexLock lock(&state_.mu);
  adoption.AssertLocked();  // the same lock: the adoption works on state_
  TESSERA_ASSIGN_OR_RETURN(bool adopted, adoption.Run(server_id));
  if (!adopted) return absl::OkStatus();
  // An open round of rows holding a slot that moved away (or, in a rollback, any) is collected again: its pushes
  // are answered UNAVAILABLE and their workers send them again where the view says.
  const int self = state_.server_id;
  state_.config->policy->DropRowRounds(
      [self](RowSlot& slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under the slot's lock (RowRounds::Drop)
        return slot.replication.primary != self;
      },
      MovedAway(state_.epoch), restore_all, rows);
  // A worker that left may have been the last one a round waited for.
  CloseCompleteRounds(*state_.config, *state_.roster, closed, rows);
  return absl::OkStatus();
}

void ShardStore::AnswerClosedRounds(ClosedRounds& closed) {
  for (ClosedRound& round : closed) {
    shipper_.AfterApplied(*round.chunk, round.values.version,
                          [waiters = std::move(round.waiters), values = round.values](const absl::Status& held) {
                            AnswerOnceHeld(waiters, values, held);
                          });
  }
}

absl::StatusOr<tessera::v1::ShardCheckpoint> ShardStore::Snapshot(int64_t at_version, absl::Time deadline,
                                                                  const std::function<bool()>& cancelled,
                                                                  const std::string& delta_base_path) {
  tessera::v1::ShardCheckpoint out;
  std::vector<Chunk*> chunks;  // units are never freed, so the pointers stay valid
  std::vector<Unit*> slots;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    out.set_server_id(state_.server_id);
    if (state_.roster != nullptr) {
      for (uint64_t inc : state_.roster->incarnation) out.add_worker_incarnations(inc);
    }
    chunks = state_.dense.Chunks();
    slots = state_.sparse.Units(Table::Role::kPrimary);
  }
  if (at_version < 0) {
    for (Chunk* chunk : chunks) {
      absl::MutexLock chunk_lock(&chunk->mu);
      *out.add_chunks() = ChunkStateLocked(*chunk);
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(std::vector<tessera::v1::ChunkState> states,
                             cut_.Take(chunks, at_version, deadline, cancelled, out.server_id()));
    for (auto& state : states) *out.add_chunks() = std::move(state);
  }
  // In SYNC a step's rounds of rows are applied before its dense round closes: without backup workers each row
  // push is answered once its round applied, and PsClient::PushRows comes first in a step; with backup workers
  // the decision that closes a dense round closes the rows' too. Once the chunks reached the cut, so did the slots.
  std::map<UnitKey, int64_t> base;  // the slots' versions in the full checkpoint a delta applies over
  if (!delta_base_path.empty()) {
    absl::MutexLock lock(&full_mu_);
    if (last_full_path_ == delta_base_path) base = last_full_versions_;
  }
  for (Unit* unit : slots) {
    auto* slot = static_cast<RowSlot*>(unit);
    absl::MutexLock slot_lock(&slot->mu);
    auto it = base.find(slot->key);
    *out.add_chunks() = it == base.end() ? slot->StateLocked() : slot->DeltaStateLocked(it->second);
  }
  return out;
}

void ShardStore::NoteFullCheckpoint(const std::string& path, const tessera::v1::ShardCheckpoint& written) {
  std::map<UnitKey, int64_t> versions;  // of the embedding slots among the file's units
  {
    absl::ReaderMutexLock lock(&state_.mu);
    for (const auto& c : written.chunks()) {
      const UnitKey key{c.param(), c.index()};
      if (state_.sparse.FindSlot(key) != nullptr) versions[key] = c.version();
    }
  }
  absl::MutexLock lock(&full_mu_);
  last_full_path_ = path;
  last_full_versions_ = std::move(versions);
}

void ShardStore::CloseCompleteRounds(const JobConfig& config, const Roster& roster, ClosedRounds& closed,
                                     RowsTaken& rows) {
  int64_t dropped = 0;
  for (Chunk* chunk : state_.dense.Chunks()) {
    absl::MutexLock chunk_lock(&chunk->mu);
    std::vector<std::shared_ptr<ExchangeWaiter>> waiters;
    double sq_norm = 0;
    if (config.policy->CloseNormIfCompleteLocked(*chunk, roster, sq_norm, waiters)) {
      closed.push_back(ClosedRound{chunk, std::move(waiters), NormLocked(*chunk, roster, sq_norm)});
      waiters.clear();
    }
    if (!config.policy->CloseIfCompleteLocked(*chunk, roster, dropped, waiters)) continue;
    cut_.OfferLocked(*chunk);
    closed.push_back(
        ClosedRound{chunk, std::move(waiters), ValuesLocked(*chunk, roster, config.job.wire().values())});
  }
  counters_.CountLate(dropped);
  config.policy->CloseRowRounds(roster, rows_.ApplierFor(state_.server_id, state_.epoch), rows);
}

absl::Status ShardStore::DecideRounds(const tessera::v1::DecideRoundsRequest& request) {
  if (request.rounds_size() > static_cast<int>(kDecidedRoundsKept)) {
    return absl::InvalidArgumentError(absl::StrCat(request.rounds_size(), " rounds decided at once; at most ",
                                                   kDecidedRoundsKept));
  }
  {
    absl::ReaderMutexLock lock(&state_.mu);
    const int workers = state_.config == nullptr ? 0 : state_.config->job.cluster().num_workers();
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
  RowsTaken rows;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    if (state_.config == nullptr || state_.roster == nullptr || !state_.config->policy->decides_rounds()) return absl::OkStatus();
    std::vector<std::pair<int64_t, std::vector<int>>> rounds;
    for (const auto& round : request.rounds()) {
      rounds.emplace_back(round.round(), std::vector<int>(round.workers().begin(), round.workers().end()));
    }
    state_.config->policy->Decide(std::move(rounds));
    CloseCompleteRounds(*state_.config, *state_.roster, closed, rows);
  }
  AnswerClosedRounds(closed);
  rows_.Finish(rows);
  return absl::OkStatus();
}

absl::StatusOr<ShardStore::Found> ShardStore::Find(const ChunkAddress& address) const {
  absl::ReaderMutexLock lock(&state_.mu);
  TESSERA_RETURN_IF_ERROR(CheckEpochLocked(state_, address.epoch));
  Chunk* chunk = state_.dense.FindChunk({std::string(address.param), address.index});
  if (chunk == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown parameter chunk '", KeyName(address), "' on server ",
                                            state_.server_id, " (it holds chunks of: ",
                                            absl::StrJoin(state_.dense.PrimaryParams(), ", "), ")"));
  }
  {
    absl::MutexLock chunk_lock(&chunk->mu);
    if (chunk->replication.lost) {
      return absl::DataLossError(absl::StrCat("chunk '", KeyName(address), "' on server ", state_.server_id,
                                              " lost its state: its backup here was made primary before its old "
                                              "primary filled it (two servers lost within moments); resume the job "
                                              "from a checkpoint"));
    }
  }
  return Found{chunk, state_.config.get(), state_.roster};
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
  found.config->policy->NoteReadLocked(chunk, request.worker_id);
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
    absl::ReaderMutexLock lock(&state_.mu);
    roster = state_.roster;
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
  absl::ReaderMutexLock lock(&state_.mu);
  return state_.config ? state_.config->job : tessera::v1::JobSpec();
}

absl::StatusOr<ShardStore::Applied> ShardStore::PushInternal(const ChunkPush& request, const FloatPayload& payload,
                                                              const std::shared_ptr<ExchangeWaiter>* waiter) {
  TESSERA_ASSIGN_OR_RETURN(Found found, Find(request.address));
  const std::string what = absl::StrCat("push to ", KeyName(request.address));
  TESSERA_RETURN_IF_ERROR(CheckPush(request, payload, found, what));
  // Decoded (and checked) outside the chunk lock; nothing has changed if this fails.
  std::shared_ptr<PooledBuffer> scratch;
  TESSERA_ASSIGN_OR_RETURN(FloatPieces values, DecodePush(*found.chunk, payload, scratch, what));
  Applied applied;
  applied.chunk = found.chunk;
  {
    absl::MutexLock lock(&found.chunk->mu);
    TESSERA_RETURN_IF_ERROR(ApplyLocked(request, values, *found.chunk, found, waiter, what, applied));
  }
  CountPush(request, payload, applied);
  return applied;
}

absl::Status ShardStore::CheckPush(const ChunkPush& request, const FloatPayload& payload, const Found& found,
                                   const std::string& what) const {
  TESSERA_RETURN_IF_ERROR(CheckPushStamp(*found.roster, found.config->job.cluster().num_workers(),
                                         PushStamp{request.worker_id, request.incarnation, request.member_key,
                                                   request.seq, request.clock, request.read_clock_version},
                                         what));
  if (request.assign && (payload.encoding().sparse || payload.encoding().precision != tessera::v1::WireSpec::FP32)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": an assignment carries dense float32 values, got ",
                                                   PrecisionName(payload.encoding().precision),
                                                   payload.encoding().sparse ? " top-k entries" : ""));
  }
  if (!request.assign && request.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch_size must be > 0, got ", request.batch_size));
  }
  return absl::OkStatus();
}



absl::StatusOr<FloatPieces> ShardStore::DecodePush(Chunk& chunk, const FloatPayload& payload,
                                                   std::shared_ptr<PooledBuffer>& scratch,
                                                   const std::string& what) const {
  // A chunk's length never changes once created.
  size_t length;
  {
    absl::ReaderMutexLock lock(&chunk.mu);
    length = chunk.values.size();
  }
  // Read where it was received when it can be (float32 in a byte buffer's fragments, what is not aligned for
  // floats spilled into a buffer of its own); else decoded where the payload lies when it has room, else into a
  // buffer of its own.
  if (payload.reads_in_place()) {
    scratch = buffers_.Get(length * sizeof(float));
    return payload.Float32Pieces(length, what, absl::MakeSpan(reinterpret_cast<float*>(scratch->data()), length));
  }
  float* room = payload.Room(length);
  if (room == nullptr) {
    scratch = buffers_.Get(length * sizeof(float));
    room = reinterpret_cast<float*>(scratch->data());
  }
  absl::Span<float> values(room, length);
  // Nothing non-finite enters the values, gradient or assignment.
  TESSERA_RETURN_IF_ERROR(payload.CopyFloatsTo(values, /*check_finite=*/true, what));
  return FloatPieces(values);
}

absl::Status ShardStore::ApplyLocked(const ChunkPush& request, const FloatPieces& values, Chunk& chunk,
                                     const Found& found, const std::shared_ptr<ExchangeWaiter>* waiter,
                                     const std::string& what, Applied& applied) {
  ConsistencyPolicy& policy = *found.config->policy;
  const Roster& roster = *found.roster;
  const int worker = request.worker_id;
  PushOutcome& outcome = applied.outcome;
  Admission& admission = applied.admission;
  auto seq_it = chunk.last_seq.find(worker);
  if (request.norm_only) {
    // Changes no state, so it takes no sequence number: a retry finds its worker in the round, or the round
    // closed with its norm kept.
    if (request.assign || chunk.module_state) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a norm-only push is a gradient of a trained parameter"));
    }
    TESSERA_ASSIGN_OR_RETURN(admission, policy.AdmitNormLocked(request, values, chunk, roster, what));
    outcome.version = chunk.version;
    if (waiter != nullptr && admission.round_open) {
      chunk.norm_round.Park(*waiter);
    } else {
      applied.values = NormLocked(chunk, roster, admission.round_sq_norm);
    }
    return absl::OkStatus();
  }
  if (seq_it != chunk.last_seq.end() && request.seq <= seq_it->second) {
    outcome.duplicate = true;
    // A retried exchange of a round that is still open waits for it like the original.
    admission.round_open = !request.assign && policy.DuplicateWaitsLocked(request, chunk);
  } else if (request.assign) {
    values.CopyTo(absl::MakeSpan(chunk.values));
    ++chunk.version;
    ++chunk.assignments;
    chunk.last_seq[worker] = request.seq;
    if (!chunk.replication.backups.empty()) LogUpdateLocked(chunk, true, values, 1.0f, 1.0f, {}, 0);
  } else if (chunk.module_state) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", chunk.key.first, "' is module state, set by assignments only, not gradients"));
  } else {
    TESSERA_ASSIGN_OR_RETURN(admission, policy.AdmitLocked(request, values, chunk, roster, what));
    chunk.last_seq[worker] = request.seq;
    outcome.late = admission.late;
    if (admission.closed) cut_.OfferLocked(chunk);
  }
  outcome.version = chunk.version;
  if (waiter != nullptr && admission.round_open) {
    chunk.round.Park(*waiter);
  } else if (waiter != nullptr || !admission.closed_waiters.empty()) {
    applied.values = ValuesLocked(chunk, roster, found.config->job.wire().values());
    if (waiter != nullptr) policy.NoteReadLocked(chunk, worker);
  }
  return absl::OkStatus();
}

void ShardStore::CountPush(const ChunkPush& request, const FloatPayload& payload, const Applied& applied) {
  const Admission& admission = applied.admission;
  // A push for a round that had closed is counted here; one left out of a round (backup workers), as the
  // round closes.
  counters_.CountPush({payload.size(), applied.outcome.duplicate, admission.after_close, admission.staleness,
                       request.worker_id, admission.compensated, admission.grad_sq, admission.compensation_sq});
  counters_.CountLate(admission.dropped);
}

void ShardStore::Push(const ChunkPush& request, const FloatPayload& values, PushDone done) {
  absl::StatusOr<Applied> applied = PushInternal(request, values, nullptr);
  if (!applied.ok()) {
    done(applied.status());
    return;
  }
  // A plain push that closed a round also answers the exchanges that waited for it.
  shipper_.AfterApplied(*applied->chunk, applied->outcome.version,
                        [done = std::move(done), outcome = applied->outcome,
                         waiters = std::move(applied->admission.closed_waiters),
                         after = std::move(applied->values)](const absl::Status& held) {
                          AnswerOnceHeld(waiters, after, held);
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
  shipper_.AfterApplied(*applied->chunk, applied->outcome.version,
                        [waiters = std::move(waiters), after = std::move(applied->values)](const absl::Status& held) {
                          AnswerOnceHeld(waiters, after, held);
                        });
}

absl::StatusOr<int64_t> ShardStore::TakeReplica(const tessera::v1::ReplicateRequest& request,
                                                std::string_view credential) {
  tessera::v1::ReplicateBatch batch;
  *batch.add_units() = request;
  TESSERA_ASSIGN_OR_RETURN(std::vector<absl::StatusOr<int64_t>> held, taker_.Take(batch, credential));
  return std::move(held.front());
}

absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> ShardStore::TakeReplicas(
    const tessera::v1::ReplicateBatch& batch, std::string_view credential) {
  return taker_.Take(batch, credential);
}

void ShardStore::CancelWaiters(const absl::Status& why) {
  std::vector<std::shared_ptr<ExchangeWaiter>> waiting;
  std::vector<std::function<void(absl::Status)>> held;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    for (Table* table : state_.tables()) {
      for (Unit* unit : table->Units(Table::Role::kPrimary)) {
        absl::MutexLock unit_lock(&unit->mu);
        for (auto& w : unit->TakeWaitersLocked()) waiting.push_back(std::move(w));
        for (auto& [version, done] : unit->replication.waiting) held.push_back(std::move(done));
        unit->replication.waiting.clear();
      }
    }
  }
  RowsTaken rows;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    if (state_.config != nullptr) state_.config->policy->CancelRowRounds(why, rows);
  }
  for (auto& w : waiting) w->Complete(why);
  for (auto& done : held) done(why);
  // Pulls that waited for a round read what is there now.
  rows_.Finish(rows);
}

tessera::v1::ShardMap ShardStore::view() const {
  absl::ReaderMutexLock lock(&state_.mu);
  return state_.view;
}

uint64_t ShardStore::epoch() const {
  absl::ReaderMutexLock lock(&state_.mu);
  return state_.epoch;
}

std::string ShardStore::job_name() const {
  absl::ReaderMutexLock lock(&state_.mu);
  return state_.config ? state_.config->job.name() : "";
}

tessera::v1::ServerStats ShardStore::Stats() const {
  tessera::v1::ServerStats stats;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    stats.set_server_id(state_.server_id);
    for (const Table* table : state_.tables()) table->AddStats(stats);
  }
  counters_.AddTo(stats);
  stats.set_replica_bytes_sent(shipper_.bytes_sent());
  stats.set_replica_bytes_received(taker_.bytes_received());
  return stats;
}

}  // namespace tessera

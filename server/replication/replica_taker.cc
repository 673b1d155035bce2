#include "server/replication/replica_taker.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"

namespace tessera {

namespace {
std::string UnitName(const tessera::v1::ChunkState& state) {
  return absl::StrCat(state.param().substr(0, kMaxNameBytes), "/", state.index());
}
}  // namespace

absl::StatusOr<std::vector<absl::StatusOr<int64_t>>> ReplicaTaker::Take(const tessera::v1::ReplicateBatch& batch,
                                                                        std::string_view credential) {
  // The units are read for their tag outside the lock; the key it used must still be the view's below.
  const Checked checked = CheckCredential(batch, credential);
  absl::ReaderMutexLock lock(&state_.mu);
  TESSERA_RETURN_IF_ERROR(CheckCall(batch, checked, credential));
  std::vector<absl::StatusOr<int64_t>> held;
  held.reserve(batch.units_size());
  size_t bytes = 0;
  for (const tessera::v1::ReplicateRequest& request : batch.units()) {
    held.push_back(TakeUnit(request));
    if (!held.back().ok()) continue;
    bytes += request.state().values().size() + request.state().optimizer_state().size();
    for (const auto& u : request.updates()) bytes += u.values().size();
  }
  bytes_received_ += static_cast<int64_t>(bytes);
  return held;
}

ReplicaTaker::Checked ReplicaTaker::CheckCredential(const tessera::v1::ReplicateBatch& batch,
                                                    std::string_view credential) const {
  Checked checked;
  int own_id = -1;
  uint64_t own_incarnation = 0;
  {
    absl::ReaderMutexLock lock(&state_.mu);
    if (batch.units_size() == 0) return checked;
    auto primary = state_.peers.find(batch.units(0).server_id());
    if (primary == state_.peers.end()) return checked;
    checked.primary_key = primary->second.replication_key;
    own_id = state_.server_id;
    auto own = state_.peers.find(state_.server_id);
    own_incarnation = own == state_.peers.end() ? 0 : own->second.incarnation;
  }
  checked.authentic = key_ != nullptr && !checked.primary_key.empty() && !credential.empty() &&
                      key_->Verify(checked.primary_key, own_id, own_incarnation, batch,
                                   absl::string_view(credential.data(), credential.size()));
  return checked;
}

absl::Status ReplicaTaker::CheckCall(const tessera::v1::ReplicateBatch& batch, const Checked& checked,
                                     std::string_view credential) const {
  // A view still on its way is ABORTED (try again), not UNAVAILABLE: this server answers.
  if (state_.config == nullptr) return absl::AbortedError("this server has no cluster view yet");
  if (batch.units_size() == 0) return absl::InvalidArgumentError("a Replicate call without a chunk");
  const int num_servers = state_.config->job.cluster().num_servers();
  const int num_workers = state_.config->job.cluster().num_workers();
  const int primary = batch.units(0).server_id();
  for (const tessera::v1::ReplicateRequest& request : batch.units()) {
    TESSERA_RETURN_IF_ERROR(CheckReplicateRequest(request, num_servers, num_workers));
    if (request.server_id() != primary) {
      return absl::InvalidArgumentError(absl::StrCat("a Replicate call from server ", primary, " holds chunk ",
                                                     UnitName(request.state()), " from server ",
                                                     request.server_id()));
    }
    // The epoch is the scheduler's to give: a request from a newer view waits for that view to come here.
    if (request.epoch() > state_.epoch) {
      return absl::AbortedError(absl::StrCat("server ", state_.server_id, " is at cluster view epoch ",
                                             state_.epoch, ", the primary at ", request.epoch(),
                                             ": its view is on its way"));
    }
  }
  auto sender = state_.peers.find(primary);
  if (sender == state_.peers.end()) {
    return absl::FailedPreconditionError(absl::StrCat("server ", state_.server_id, " at cluster view epoch ",
                                                      state_.epoch, ": server ", primary, " is not in its view"));
  }
  const std::string what = batch.units_size() == 1
                               ? absl::StrCat("state of chunk ", UnitName(batch.units(0).state()), " as server ",
                                              primary)
                               : absl::StrCat("states of ", batch.units_size(), " chunks as server ", primary);
  if (checked.authentic && checked.primary_key == sender->second.replication_key) return absl::OkStatus();
  return absl::UnauthenticatedError(absl::StrCat(what, ": ",
                                                 sender->second.replication_key.empty()
                                                     ? "the view has no replication key for that server"
                                                 : credential.empty() ? "the call is not signed"
                                                                      : "not signed by that server for this one"));
}

absl::StatusOr<int64_t> ReplicaTaker::TakeUnit(const tessera::v1::ReplicateRequest& request) {
  const tessera::v1::ChunkState& state = request.state();
  Unit* unit = nullptr;
  for (const Table* table : state_.tables()) {
    if (unit == nullptr) unit = table->Find({state.param(), state.index()}, Table::Role::kBackup);
  }
  if (unit == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("server ", state_.server_id, " at cluster view epoch ",
                                                      state_.epoch, ": it does not back up chunk ",
                                                      UnitName(state)));
  }
  absl::MutexLock unit_lock(&unit->mu);
  if (unit->replication.primary != request.server_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server ", state_.server_id, " at cluster view epoch ", state_.epoch, ": chunk ", UnitName(state),
        "'s primary is server ", unit->replication.primary, ", not ", request.server_id()));
  }
  // States of one primary come in order; one from an older view (a primary since replaced) is ignored.
  if (request.epoch() < unit->replication.taken_epoch ||
      (request.epoch() == unit->replication.taken_epoch && state.version() < unit->version)) {
    return unit->version;
  }
  TESSERA_RETURN_IF_ERROR(
      unit->TakeReplicaLocked(state_.config->rule, request, state_.config->job.cluster().num_workers()));
  unit->replication.taken_epoch = request.epoch();
  unit->replication.filled = true;
  return state.version();
}

}  // namespace tessera

#include "server/replication/replica_taker.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_limits.h"
#include "server/replica_auth.h"

namespace tessera {

namespace {
std::string UnitName(const tessera::v1::ChunkState& state) {
  return absl::StrCat(state.param().substr(0, kMaxNameBytes), "/", state.index());
}
}  // namespace

absl::StatusOr<int64_t> ReplicaTaker::Take(const tessera::v1::ReplicateRequest& request,
                                           std::string_view signature) {
  const tessera::v1::ChunkState& state = request.state();
  // Hashed before any lock: the signature covers the whole request, state included.
  const std::string digest = ReplicateDigest(request);
  absl::ReaderMutexLock lock(&state_.mu);
  TESSERA_ASSIGN_OR_RETURN(Unit * unit, FindBackedUp(request, digest, signature));
  {
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
  }
  size_t bytes = state.values().size() + state.optimizer_state().size();
  for (const auto& u : request.updates()) bytes += u.values().size();
  bytes_received_ += static_cast<int64_t>(bytes);
  return state.version();
}

absl::StatusOr<Unit*> ReplicaTaker::FindBackedUp(const tessera::v1::ReplicateRequest& request,
                                                 const std::string& digest, std::string_view signature) const {
  // A view still on its way is ABORTED (try again), not UNAVAILABLE: this server answers.
  if (state_.config == nullptr) return absl::AbortedError("this server has no cluster view yet");
  TESSERA_RETURN_IF_ERROR(CheckReplicateRequest(request, state_.config->job.cluster().num_servers(),
                                                state_.config->job.cluster().num_workers()));
  // The epoch is the scheduler's to give: a request from a newer view waits for that view to come here.
  if (request.epoch() > state_.epoch) {
    return absl::AbortedError(absl::StrCat("server ", state_.server_id, " is at cluster view epoch ", state_.epoch,
                                           ", the primary at ", request.epoch(), ": its view is on its way"));
  }
  auto not_backup = [self = state_.server_id, epoch = state_.epoch](const std::string& why) -> absl::Status {
    return absl::FailedPreconditionError(absl::StrCat("server ", self, " at cluster view epoch ", epoch, ": ", why));
  };
  auto sender = state_.peers.find(request.server_id());
  if (sender == state_.peers.end()) {
    return not_backup(absl::StrCat("server ", request.server_id(), " is not in its view"));
  }
  const std::string name = UnitName(request.state());
  TESSERA_RETURN_IF_ERROR(CheckSigned(sender->second, digest, signature,
                                      absl::StrCat("state of chunk ", name, " as server ", request.server_id())));
  Unit* unit = nullptr;
  for (const Table* table : state_.tables()) {
    if (unit == nullptr) unit = table->Find({request.state().param(), request.state().index()}, Table::Role::kBackup);
  }
  if (unit == nullptr) return not_backup(absl::StrCat("it does not back up chunk ", name));
  return unit;
}

absl::Status ReplicaTaker::CheckSigned(const Peer& primary, const std::string& digest, std::string_view signature,
                                       const std::string& what) const {
  auto own = state_.peers.find(state_.server_id);
  const uint64_t incarnation = own == state_.peers.end() ? 0 : own->second.incarnation;
  if (!primary.replication_key.empty() &&
      VerifyReplicaSignature(primary.replication_key, ReplicateProof(digest, state_.server_id, incarnation),
                             absl::string_view(signature.data(), signature.size()))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(what, ": ",
                                                 primary.replication_key.empty()
                                                     ? "the view has no replication key for that server"
                                                 : signature.empty() ? "the call is not signed"
                                                                     : "not signed by that server for this one"));
}

}  // namespace tessera

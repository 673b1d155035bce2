#include "server/request_checks.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/security.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"

namespace tessera {

absl::Status CheckEpochLocked(const StoreState& state, uint64_t epoch) {
  if (epoch < state.epoch) {
    absl::Status status = absl::FailedPreconditionError(absl::StrCat(
        "stale shard map: request has epoch ", epoch, ", server ", state.server_id, " is at epoch ", state.epoch));
    SetCurrentEpoch(status, state.epoch);
    return status;
  }
  if (epoch > state.epoch) {
    // With the server's epoch: the caller sees this server answered (it is not to be reported as unreachable).
    absl::Status status = absl::UnavailableError(absl::StrCat("server ", state.server_id, " is at shard map epoch ",
                                                              state.epoch, ", request has ", epoch,
                                                              "; its assignment is on the way"));
    SetCurrentEpoch(status, state.epoch);
    return status;
  }
  return absl::OkStatus();
}

absl::Status CheckPusher(const Roster& roster, int worker, uint64_t incarnation, std::string_view member_key) {
  if (!roster.key_digest[worker].empty() &&
      !SecretsEqual(KeyDigest(absl::string_view(member_key.data(), member_key.size())), roster.key_digest[worker])) {
    return absl::UnauthenticatedError(absl::StrCat("push as worker ", worker, ": ",
                                                   member_key.empty() ? "the call carried no member key"
                                                                      : "wrong member key"));
  }
  if (!roster.active[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker,
                                                      " is not in the job's cluster view (it was declared lost); "
                                                      "register again to rejoin"));
  }
  if (roster.incarnation[worker] != 0 && incarnation != roster.incarnation[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker, " incarnation ", incarnation,
                                                      " is not in the job: the rank is held by incarnation ",
                                                      roster.incarnation[worker]));
  }
  return absl::OkStatus();
}

absl::Status CheckPushStamp(const Roster& roster, int workers, const PushStamp& stamp, const std::string& what) {
  if (stamp.worker < 0 || stamp.worker >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", stamp.worker, " out of range: the job has ", workers, " workers"));
  }
  TESSERA_RETURN_IF_ERROR(CheckPusher(roster, stamp.worker, stamp.incarnation, stamp.member_key));
  if (stamp.seq == 0 || stamp.seq > static_cast<uint64_t>(kMaxUpdateCount)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": seq ", stamp.seq, " is not within 1 .. ", kMaxUpdateCount));
  }
  if (stamp.clock < 0 || stamp.clock > kMaxClock || stamp.read_clock < 0 || stamp.read_clock > kMaxClock) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": clock ", stamp.clock, " and read clock ", stamp.read_clock,
                                                   " must be within 0 .. ", kMaxClock));
  }
  return absl::OkStatus();
}

}  // namespace tessera

// Registrations for scheduler unit tests: the requests a server and a worker send, and a join as the coordinator
// makes it (joined, then answered).
#ifndef TESSERA_TESTS_TESTING_REGISTRATIONS_H_
#define TESSERA_TESTS_TESTING_REGISTRATIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "scheduler/membership/cluster_view.h"

namespace tessera::testing {

// A server at `address` (asking for `id` when it is not -1), with its control and replication keys.
inline tessera::v1::RegisterRequest ServerRegistration(const std::string& address, int id = -1) {
  tessera::v1::RegisterRequest r;
  r.set_role(tessera::v1::SERVER);
  if (id >= 0) r.set_requested_id(id);
  r.set_address(address);
  r.set_control_key("control-key-of-" + address);
  r.set_replication_key(std::string(32, 'r'));  // a server's public replication key (server/replica_auth.h)
  return r;
}

// A worker on `host` (asking for `rank` when it is not -1).
inline tessera::v1::RegisterRequest WorkerRegistration(const std::string& host, int rank = -1) {
  tessera::v1::RegisterRequest r;
  r.set_role(tessera::v1::WORKER);
  r.set_hostname(host);
  if (rank >= 0) r.set_requested_id(rank);
  return r;
}

inline int64_t AtZero(const Member&) { return 0; }

// Joins `request` at `now` and answers it at once, as JobCoordinator::Register does.
inline absl::StatusOr<ClusterView::Joined> JoinAnswered(
    ClusterView& view, const tessera::v1::RegisterRequest& request, absl::Time now,
    const std::function<int64_t(const Member&)>& start = AtZero,
    absl::Duration suspect_after = absl::InfiniteDuration()) {
  absl::StatusOr<ClusterView::Joined> joined = view.Join(request, now, start, suspect_after);
  if (joined.ok()) view.Answered(joined->member.role, joined->member.id, joined->member.incarnation, now);
  return joined;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_REGISTRATIONS_H_

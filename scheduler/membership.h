// Who is in the job: servers and workers, the ids handed out at registration, and when each was last heard.
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace tessera {

struct Member {
  tessera::v1::Role role = tessera::v1::ROLE_UNSPECIFIED;
  int id = -1;
  std::string address;
  std::string hostname;
  std::string device;
  absl::Time last_seen;
};

// Thread-safe.
class Membership {
 public:
  Membership(int num_servers, int num_workers) : num_servers_(num_servers), num_workers_(num_workers) {}

  // Hands out the next server id or worker rank. RESOURCE_EXHAUSTED when the job already has all the nodes of
  // that role it asked for; INVALID_ARGUMENT for a server without an address or an unknown role.
  [[nodiscard]] absl::StatusOr<int> Add(const tessera::v1::RegisterRequest& request, absl::Time now);

  // Notes a heartbeat. NOT_FOUND for a node that never registered.
  [[nodiscard]] absl::Status Touch(tessera::v1::Role role, int id, absl::Time now);

  // Workers not heard from for `timeout` (registration counts as hearing from them).
  std::vector<int> SilentWorkers(absl::Time now, absl::Duration timeout) const;

  // Records the device a worker computes on (known to the worker only after it registered).
  void SetWorkerDevice(int id, const std::string& device);

  // While the job still lacks members: who is missing, and when each registered member was last heard (those
  // silent for longer than `timeout` marked lost), e.g. "waiting for 1 more server and 2 more workers; server 0
  // at node7:4100 last heard 1 s ago; server 1 at node8:4100 lost, last heard 34 s ago". Empty once every
  // member has registered.
  std::string WaitingSummary(absl::Time now, absl::Duration timeout) const;

  std::vector<Member> Servers() const;
  std::vector<Member> Workers() const;
  bool AllServersRegistered() const;

  int num_servers() const { return num_servers_; }
  int num_workers() const { return num_workers_; }

 private:
  const int num_servers_;
  const int num_workers_;

  mutable absl::Mutex mu_;
  std::vector<Member> servers_ ABSL_GUARDED_BY(mu_);
  std::vector<Member> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_H_

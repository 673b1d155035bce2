// A slot of a job (a server id or a worker rank) and the member holding it, as the cluster view records them.
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_MEMBER_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_MEMBER_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "proto/cluster.pb.h"

namespace tessera {

enum class MemberState { kVacant, kAlive, kLost, kDone };

// "vacant", "alive", "lost", "done".
const char* MemberStateName(MemberState state);

struct Member {
  tessera::v1::Role role = tessera::v1::ROLE_UNSPECIFIED;
  int id = -1;
  uint64_t incarnation = 0;  // 0: nobody ever held the slot
  MemberState state = MemberState::kVacant;
  std::string address;
  std::string fabric_address;  // servers: the UCX worker address (base64); empty when none
  std::string hostname;
  std::string device;
  absl::Time last_seen;
  int64_t joined_clock = 0;  // workers: the clock this incarnation started at
  std::string key;           // the member key this incarnation was given (common/rpc/security.h)
  std::string key_digest;    // its SHA-256, which the view hands to servers
  std::string control_key;   // servers: the key their control calls need
  // Servers: the X25519 public key their Replicate calls are authenticated with (server/replica_auth.h).
  std::string replication_key;
  // In the view a restarted scheduler took back, not come back yet: its calls are answered NOT_FOUND (come back
  // first: ClusterView::Return), and it is lost like a silent member when it does not come back.
  bool awaited = false;
  // Registered afresh and not told so yet (the servers take the view with its key first, and a frozen server
  // makes that slow): its silence is the scheduler's, so it is not lost for it (ClusterView::Answered).
  bool unanswered = false;

  // "server 1 at node8:4100" or "worker 2 on gpu3".
  std::string Describe() const;
};

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_MEMBER_H_

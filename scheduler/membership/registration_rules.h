// Who takes which slot of a job: the checks every registration must pass and the choice of slot (see
// ClusterView::Join for the rules), as functions over the slots of one role. ClusterView calls them under its
// lock; they hold no state.
#ifndef TESSERA_SCHEDULER_MEMBERSHIP_REGISTRATION_RULES_H_
#define TESSERA_SCHEDULER_MEMBERSHIP_REGISTRATION_RULES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "scheduler/membership/member.h"

namespace tessera {

// What every registration (a first one, or a member coming back) must hold: a known role, the lengths
// common/model/wire_limits.h allows, and for a server its address and the key of its control calls.
[[nodiscard]] absl::Status CheckRegistration(const tessera::v1::RegisterRequest& request);

// `slot` is held from `now` by the member of `request`, alive, with member key `key`.
void HoldSlot(Member& slot, const tessera::v1::RegisterRequest& request, std::string key, absl::Time now);

// The slot a registration takes among `slots` (its role's): the one it asks for (even from a holder alive),
// else the first vacant, lost, then done one; nullptr when every slot is held. INVALID_ARGUMENT for a requested
// id outside the job.
[[nodiscard]] absl::StatusOr<Member*> ChooseSlot(const tessera::v1::RegisterRequest& request,
                                                 std::vector<Member>& slots);

// Why a registration finds every slot of its role held: UNAVAILABLE naming the member heard from longest ago
// among those silent for longer than `suspect_after` or on the registrant's host (most likely the registrant's
// own earlier self, killed and restarted before it is declared lost); RESOURCE_EXHAUSTED otherwise.
absl::Status NoFreeSlot(const tessera::v1::RegisterRequest& request, const std::vector<Member>& slots,
                        absl::Time now, absl::Duration suspect_after);

// Who a job still lacks, e.g. "waiting for 1 more server and 2 more workers; server 0 at node7:4100 last heard
// 1 s ago; server 1 at node8:4100 lost, last heard 34 s ago" (members silent for longer than `timeout` are
// called lost). Empty once every slot is alive or done.
std::string WaitingSummary(const std::vector<Member>& servers, const std::vector<Member>& workers, absl::Time now,
                           absl::Duration timeout);

}  // namespace tessera

#endif  // TESSERA_SCHEDULER_MEMBERSHIP_REGISTRATION_RULES_H_

// How one training step is exchanged with the servers, one class per consistency mode (PsClient::BeginStep
// makes the job's; nothing else in the client library asks which mode the job runs):
//
//   SYNC   SyncExchangeStep: one PushPull per chunk, started as each gradient is sent and answered when the
//          chunk's round closes; the scheduler's clock is advanced on the client's clock executor meanwhile.
//          With backup workers the clock goes out in Finish (it then says "every gradient of this step is sent",
//          which is how the scheduler picks a round's members).
//   ASYNC  AsyncExchangeStep: one PushPull per chunk, answered right after its push; Finish advances the clock,
//          which never waits.
//   SSP    SspStep: push, clock gate and pull, all in Finish (the gate holds a worker too far ahead).
#ifndef TESSERA_WORKER_CLIENT_STEP_PROTOCOLS_H_
#define TESSERA_WORKER_CLIENT_STEP_PROTOCOLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "worker/client/ps_client.h"

namespace tessera {

// The step protocol of `client`'s job for one step (see PsClient::BeginStep for the arguments).
std::unique_ptr<StepExchange> MakeStepProtocol(PsClient* client, const std::vector<std::string>& names,
                                               const std::vector<absl::Span<const float>>& grads, int batch_size,
                                               const std::vector<absl::Span<float>>& out);

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_STEP_PROTOCOLS_H_

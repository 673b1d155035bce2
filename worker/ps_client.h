// The worker-side client library: what a training loop programs against.
//
//   tessera::PsClient::Options options;
//   options.scheduler_address = "127.0.0.1:7000";
//   auto client = tessera::PsClient::Connect(options);      // registers: rank and JobSpec come back
//   if (!client.ok()) return client.status();
//   tessera::v1::ParameterSpec w;                            // name, dtype, shape, init
//   w.set_name("w"); w.set_dtype(tessera::v1::DT_FLOAT32); w.add_shape(1000);
//   TESSERA_RETURN_IF_ERROR((*client)->Declare({w}));        // placed on the servers in chunks
//   std::vector<float> values(1000), grad(1000);
//   while (true) {
//     TESSERA_RETURN_IF_ERROR((*client)->Pull({"w"}, {absl::MakeSpan(values)}));
//     ... compute grad from values on a batch of 32 ...
//     TESSERA_RETURN_IF_ERROR((*client)->Push({"w"}, {grad}, /*batch_size=*/32));
//     TESSERA_ASSIGN_OR_RETURN(tessera::ClockResult clock, (*client)->Clock());
//     if (clock.stop) break;
//   }
//   TESSERA_RETURN_IF_ERROR((*client)->Done());
//
// Every chunk of a call travels as its own RPC, all in flight at once across servers. Calls retry by
// themselves when a server is briefly unavailable and when the shard map moved on (FAILED_PRECONDITION with a
// newer epoch: the map is refreshed from the scheduler first). A retried push reuses its sequence number, so a
// server applies it at most once.
//
// Consistency is the job's: in SYNC, Push contributes to the round of the current clock and Clock() returns when
// every worker has pushed that round; in SSP(s), Clock() holds a worker more than s clocks ahead of the slowest;
// in ASYNC it never waits.
#ifndef TESSERA_WORKER_PS_CLIENT_H_
#define TESSERA_WORKER_PS_CLIENT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/heartbeater.h"
#include "common/scheduler_client.h"
#include "common/shard_map.h"
#include "proto/ps.grpc.pb.h"

namespace tessera {

struct ClockResult {
  int64_t clock = 0;      // this worker's clock now (steps completed)
  int64_t min_clock = 0;  // the slowest worker's clock when the gate opened
  bool stop = false;      // the job is over: finish and call Done()
  std::string stop_reason;
};

// Not thread-safe: one training loop drives one client (its heartbeat runs on a thread of its own).
class PsClient {
 public:
  struct Options {
    std::string scheduler_address;                   // HOST:PORT (required)
    std::string device = "cpu";                      // reported to the scheduler
    int connect_attempts = 20;                       // tries to reach the scheduler (backoff up to 1 s)
    absl::Duration rpc_timeout = absl::Seconds(30);  // per data-plane RPC
    absl::Duration clock_wait_timeout = absl::Minutes(5);  // longest wait at the clock gate
    absl::Duration declare_timeout = absl::Minutes(2);     // waiting for servers to register
    int retries = 8;                                 // per call, on UNAVAILABLE or a stale epoch
    bool heartbeat = true;
  };

  // Registers with the scheduler. UNAVAILABLE naming the address when no scheduler answers.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PsClient>> Connect(const Options& options);
  ~PsClient();

  int worker_id() const { return worker_id_; }
  const tessera::v1::JobSpec& job() const { return job_; }
  int64_t clock() const { return clock_; }
  uint64_t epoch() const { return map_ ? map_->epoch() : 0; }
  // The shard map this client holds; null before Declare.
  const tessera::v1::ShardMap* shard_map() const { return map_ ? &map_->map() : nullptr; }

  // Declares parameters (all workers declare the same ones; the first declaration places them). Blocks until
  // every server has registered and holds its chunks. FAILED_PRECONDITION when a name is already declared
  // with another shape.
  [[nodiscard]] absl::Status Declare(const std::vector<tessera::v1::ParameterSpec>& params);

  // Fills out[i] with the current value of names[i]. NOT_FOUND for an undeclared name; INVALID_ARGUMENT when a
  // span's size is not the parameter's element count.
  [[nodiscard]] absl::Status Pull(const std::vector<std::string>& names, const std::vector<absl::Span<float>>& out);

  // Sends gradients of the mean loss over `batch_size` examples, for this worker's current clock. The server
  // rejects non-finite values (INVALID_ARGUMENT) and changes nothing then.
  [[nodiscard]] absl::Status Push(const std::vector<std::string>& names,
                                  const std::vector<absl::Span<const float>>& grads, int batch_size);

  // Push, then Pull of the same parameters (the values after the server applied what it could; in SYNC the
  // round closes only when every worker has pushed, so call Clock() before relying on the new values).
  [[nodiscard]] absl::Status PushPull(const std::vector<std::string>& names,
                                      const std::vector<absl::Span<const float>>& grads, int batch_size,
                                      const std::vector<absl::Span<float>>& out);

  // Overwrites the values of names[i] (initialisation or restore); applied at most once, like a push.
  [[nodiscard]] absl::Status Assign(const std::vector<std::string>& names,
                                    const std::vector<absl::Span<const float>>& values);

  // Completes this worker's step: advances its clock and waits at the gate for the next one.
  [[nodiscard]] absl::StatusOr<ClockResult> Clock();

  // Progress for the scheduler's records (clock and worker id are filled in). The answer says whether the job
  // has stopped (e.g. this evaluation reached the target accuracy).
  [[nodiscard]] absl::StatusOr<tessera::v1::ReportResponse> Report(tessera::v1::ReportRequest report);

  // This worker is finished; it no longer holds others back.
  [[nodiscard]] absl::Status Done();

  // Value bytes received by pulls so far (unchanged chunks cost none).
  int64_t bytes_pulled() const { return bytes_pulled_; }


 private:
  struct ChunkCall;
  explicit PsClient(const Options& options);

  absl::Status RefreshMap(uint64_t at_least_epoch);
  tessera::v1::ParameterServer::Stub* StubFor(int server_id);
  // Runs one RPC per chunk of `names`, all in flight together; retries the whole set on a stale epoch or
  // UNAVAILABLE. `kind` selects pull or push; `grads` (push) or `out` (pull) hold the values.
  absl::Status RunChunks(bool push, tessera::v1::PushRequest::Kind kind, const std::vector<std::string>& names,
                         const std::vector<absl::Span<const float>>& grads, int batch_size,
                         const std::vector<absl::Span<float>>& out);

  const Options options_;
  std::unique_ptr<SchedulerClient> scheduler_;
  std::unique_ptr<Heartbeater> heartbeater_;
  int worker_id_ = -1;
  tessera::v1::JobSpec job_;
  std::unique_ptr<ShardMapIndex> map_;
  std::map<std::string, std::unique_ptr<tessera::v1::ParameterServer::Stub>> stubs_;  // by address
  // What the last pull of each chunk returned. A pull names the version it holds, and a server whose chunk has
  // not changed since answers with no bytes; the values then come from here.
  struct PulledChunk {
    int64_t version = -1;
    int64_t clock_version = 0;
    std::vector<float> values;
  };
  std::map<std::pair<std::string, int>, PulledChunk> pulled_;
  int64_t bytes_pulled_ = 0;
  int64_t clock_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_WORKER_PS_CLIENT_H_

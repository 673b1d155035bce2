// Typed calls to the scheduler, returning absl::Status; shared by servers and workers.
#ifndef TESSERA_COMMON_RPC_SCHEDULER_CLIENT_H_
#define TESSERA_COMMON_RPC_SCHEDULER_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "common/base/heartbeater.h"
#include "common/rpc/security.h"
#include "proto/cluster.grpc.pb.h"

namespace tessera {

// Thread-safe (a gRPC stub is).
class SchedulerClient {
 public:
  // Does not connect yet. `address` is HOST:PORT. Every call carries `security`'s job token, and once
  // registered, the member key the scheduler gave.
  SchedulerClient(std::string address, std::shared_ptr<const Security> security);

  const std::string& address() const { return address_; }

  // Registers (filling in this host's name), retrying while nobody answers at the address, with backoff (50 ms
  // doubling to 1 s) for up to `give_up_after` (one warning line when the first try finds nobody), then
  // UNAVAILABLE naming the address. Other errors (a full job) come back at once.
  [[nodiscard]] absl::StatusOr<tessera::v1::RegisterResponse> Register(tessera::v1::RegisterRequest request,
                                                                       absl::Duration give_up_after);

  // After Register: this member comes back by itself to a scheduler that restarted (JobCoordinator::Register's
  // take-back). `state` fills in what it holds at that moment (a server's view, a worker's clock; called on
  // the thread of the call that found the scheduler new). From now on, a call below answered NOT_FOUND (the
  // scheduler does not know this member) registers again with the rejoin, once at a time across threads, and
  // is tried again; and AdvanceClock, Report, GetShardMap and Done (without a failure) that find no scheduler
  // (UNAVAILABLE) are tried again, with backoff, until it has not been heard from for the heartbeat timeout
  // the registration gave (the members' heartbeats give up on it as long after).
  void EnableReturn(std::function<void(tessera::v1::MemberReturn&)> state);

  [[nodiscard]] absl::StatusOr<tessera::v1::HeartbeatResponse> Heartbeat(const tessera::v1::HeartbeatRequest& request);

  // Starts heartbeating as (role, id, incarnation) every `interval` on a thread of its own. `on_job_finished` runs when the
  // scheduler answers that the job is over; `on_lost` once, when no heartbeat succeeded for `give_up_after`.
  // The client must outlive the returned heartbeater.
  std::unique_ptr<Heartbeater> StartHeartbeats(tessera::v1::Role role, int id, uint64_t incarnation,
                                               absl::Duration interval,
                                               std::function<void()> on_job_finished,
                                               std::function<void(const absl::Status&)> on_lost,
                                               absl::Duration give_up_after);

  // Retries while the scheduler answers UNAVAILABLE (still waiting for servers), up to `timeout`.
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardMap> Declare(const tessera::v1::DeclareRequest& request,
                                                              absl::Duration timeout);
  [[nodiscard]] absl::StatusOr<tessera::v1::ShardMap> GetShardMap();

  // Blocks until the gate opens, the job stops, or `wait_timeout` passes (DEADLINE_EXCEEDED naming the workers
  // being waited for). `step_samples` and `step_busy_seconds` measure the worker's last step (0: none).
  [[nodiscard]] absl::StatusOr<tessera::v1::AdvanceClockResponse> AdvanceClock(int worker_id, int64_t clock,
                                                                               absl::Duration wait_timeout,
                                                                               int step_samples = 0,
                                                                               double step_busy_seconds = 0);
  [[nodiscard]] absl::StatusOr<tessera::v1::ReportResponse> Report(const tessera::v1::ReportRequest& request);
  // The worker leaves the job: at its end, or, with a `failure`, because of that error (sent as its text, cut
  // to common/model/wire_limits.h's kMaxErrorBytes; waits at most 2 s for the answer).
  // `program_error`: the failure is the training program's own (DoneRequest.program_error).
  [[nodiscard]] absl::Status Done(int worker_id, int64_t clock, const absl::Status& failure = absl::OkStatus(),
                                  bool program_error = false);
  // Member (`role`, `member_id`) could not reach server `server_id` (incarnation `incarnation`) and says so
  // (`error`, cut like Done's failure): the scheduler probes it and declares it lost at once when it does not
  // answer.
  [[nodiscard]] absl::Status ReportServer(tessera::v1::Role role, int member_id, int server_id, uint64_t incarnation,
                                          const absl::Status& error);

  // The key from the last registration; empty before.
  std::string member_key() const;
  // A heartbeat answered that the job is stopping or over. Thread-safe, without a call.
  bool stopping() const { return stopping_.load(); }
  const std::shared_ptr<const Security>& security() const { return security_; }

 private:
  // Sets `context`'s deadline, the job token and the member key.
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;
  // Runs a member call's `attempt` (a fresh context each time) as EnableReturn says; `retry_unavailable`: tried
  // again while the scheduler does not answer.
  [[nodiscard]] absl::Status MemberCall(const std::function<absl::Status()>& attempt, bool retry_unavailable);
  // Registers again with the rejoin, unless another thread came back since `seen_returns`.
  [[nodiscard]] absl::Status ComeBack(uint64_t seen_returns);
  void Heard();

  const std::string address_;
  const std::shared_ptr<const Security> security_;
  mutable absl::Mutex mu_;
  std::string member_key_ ABSL_GUARDED_BY(mu_);
  // What coming back needs: the registration, its answer, what the member holds; and how often it came back.
  tessera::v1::RegisterRequest registration_ ABSL_GUARDED_BY(mu_);
  tessera::v1::RegisterResponse registered_ ABSL_GUARDED_BY(mu_);
  std::function<void(tessera::v1::MemberReturn&)> return_state_ ABSL_GUARDED_BY(mu_);
  uint64_t returns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Mutex return_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one comeback at a time
  std::atomic<bool> stopping_{false};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tessera::v1::Scheduler::Stub> stub_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_SCHEDULER_CLIENT_H_

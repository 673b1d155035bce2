// The scheduler's core without gRPC: a JobCoordinator with fake servers (tests/testing/fake_server_control.h)
// runs whole jobs driven by calls as the service makes them.
#include "scheduler/job_coordinator.h"

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/model/job_spec.h"
#include "common/daemon/run_recorder.h"
#include "common/model/wire_limits.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_server_control.h"
#include "tests/testing/param_spec.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::FakeServerControl;
using ::tessera::testing::FloatParam;
using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using tessera::v1::ConsistencySpec;

// Waits for the answer a coordinator call hands to its callback (on the coordinator's executor).
template <typename T>
class Answer {
 public:
  std::function<void(absl::StatusOr<T>)> callback() {
    return [this](absl::StatusOr<T> answer) {
      value_ = std::move(answer);
      done_.Notify();
    };
  }
  absl::StatusOr<T> Get() {
    if (!done_.WaitForNotificationWithTimeout(absl::Seconds(30))) return absl::DeadlineExceededError("no answer");
    return value_;
  }
  bool Ready() const { return done_.HasBeenNotified(); }

 private:
  absl::Notification done_;
  absl::StatusOr<T> value_ = absl::UnknownError("unset");
};

// What member (role, id) registers with: servers an address and a control key of their own, workers a host.
tessera::v1::RegisterRequest Registration(tessera::v1::Role role, int id) {
  tessera::v1::RegisterRequest r;
  r.set_role(role);
  r.set_requested_id(id);
  if (role == tessera::v1::SERVER) {
    r.set_address(absl::StrCat("127.0.0.1:", 7000 + id));
    r.set_control_key(absl::StrCat("control-", id));
  } else {
    r.set_hostname(absl::StrCat("worker-host-", id));
  }
  return r;
}

class JobCoordinatorTest : public ::testing::Test {
 protected:
  void Create(ConsistencySpec::Mode mode, int64_t max_steps, absl::Duration heartbeat_timeout = absl::Seconds(10)) {
    job_.set_name("coordinator-test");
    job_.mutable_model()->mutable_mlp()->add_hidden_sizes(4);
    job_.mutable_data()->set_format(tessera::v1::DataSpec::SYNTHETIC);
    job_.set_batch_size(4);
    job_.set_chunk_bytes(64);
    job_.mutable_stop()->set_max_steps(max_steps);
    job_.mutable_cluster()->set_num_servers(2);
    job_.mutable_cluster()->set_num_workers(2);
    job_.mutable_consistency()->set_mode(mode);
    ApplyJobDefaults(job_);
    ASSERT_THAT(ValidateJobSpec(job_), IsOk());
    auto created = JobCoordinator::Create(job_, /*run_dir=*/"", absl::Milliseconds(100), heartbeat_timeout,
                                          &servers_, [this](const JobOutcome& outcome) {
                                            outcome_ = outcome;
                                            finished_.Notify();
                                          });
    ASSERT_THAT(created, IsOk());
    coordinator_ = std::move(*created);
  }

  absl::StatusOr<tessera::v1::RegisterResponse> Register(tessera::v1::Role role, int id) {
    Answer<tessera::v1::RegisterResponse> answer;
    coordinator_->Register(Registration(role, id), answer.callback());
    return answer.Get();
  }

  // Worker `worker`'s report of an evaluation of clock `clock` with test accuracy `accuracy`.
  static tessera::v1::ReportRequest Evaluation(int worker, int64_t clock, double accuracy) {
    tessera::v1::ReportRequest eval;
    eval.set_worker_id(worker);
    eval.set_clock(clock);
    eval.set_has_eval(true);
    eval.set_eval_clock(clock);
    eval.set_test_accuracy(accuracy);
    return eval;
  }

  // Both servers and both workers, each under its own id; their member keys go to `keys` ([server/worker][id])
  // when given.
  void RegisterEveryone(std::string (*keys)[2] = nullptr) {
    for (int id = 0; id < 2; ++id) {
      absl::StatusOr<tessera::v1::RegisterResponse> s = Register(tessera::v1::SERVER, id);
      absl::StatusOr<tessera::v1::RegisterResponse> w = Register(tessera::v1::WORKER, id);
      ASSERT_THAT(s, IsOk());
      ASSERT_THAT(w, IsOk());
      if (keys != nullptr) {
        keys[0][id] = s->member_key();
        keys[1][id] = w->member_key();
      }
    }
  }

  // One heartbeat of each (role, id) in `members`, first incarnation.
  void Beat(const std::vector<std::pair<tessera::v1::Role, int>>& members) {
    for (auto [role, id] : members) {
      tessera::v1::HeartbeatRequest beat;
      beat.set_role(role);
      beat.set_id(id);
      beat.set_incarnation(1);
      ASSERT_THAT(coordinator_->Heartbeat(beat), IsOk());
    }
  }

  absl::StatusOr<tessera::v1::ShardMap> Declare(int worker) {
    tessera::v1::DeclareRequest r;
    r.set_worker_id(worker);
    *r.add_params() = FloatParam("w", 40);
    Answer<tessera::v1::ShardMap> answer;
    coordinator_->Declare(r, answer.callback());
    return answer.Get();
  }

  void Advance(int worker, int64_t clock, Answer<tessera::v1::AdvanceClockResponse>& answer) {
    tessera::v1::AdvanceClockRequest r;
    r.set_worker_id(worker);
    r.set_clock(clock);
    r.set_wait_timeout_ms(30000);
    coordinator_->AdvanceClock(r, answer.callback());
  }

  absl::Status Done(int worker, int64_t clock) {
    tessera::v1::DoneRequest r;
    r.set_worker_id(worker);
    r.set_clock(clock);
    return coordinator_->Done(r);
  }

  tessera::v1::JobSpec job_;
  FakeServerControl servers_;
  std::unique_ptr<JobCoordinator> coordinator_;
  absl::Notification finished_;
  JobOutcome outcome_;
};

TEST_F(JobCoordinatorTest, ASyncJobRunsFromRegistrationToSummaryInLockstep) {
  Create(ConsistencySpec::SYNC, /*max_steps=*/3);
  ASSERT_THAT(Register(tessera::v1::WORKER, 0), IsOk());
  ASSERT_THAT(Register(tessera::v1::SERVER, 0), IsOk());
  EXPECT_THAT(Declare(0).status(), StatusIs(absl::StatusCode::kUnavailable, "server"))
      << "no placement before every server is in";
  EXPECT_EQ(servers_.assigns(), 0);
  ASSERT_THAT(Register(tessera::v1::SERVER, 1), IsOk());
  ASSERT_THAT(Register(tessera::v1::WORKER, 1), IsOk());

  absl::StatusOr<tessera::v1::ShardMap> map = Declare(0);
  ASSERT_THAT(map, IsOk());
  EXPECT_EQ(servers_.assigns(), 1) << "the servers hold the view before a worker gets the map";
  EXPECT_EQ(servers_.assigned().epoch(), map->epoch());
  EXPECT_EQ(map->servers_size(), 2);
  ASSERT_THAT(Declare(1), IsOk());
  EXPECT_EQ(servers_.assigns(), 1) << "the second declaration finds the placement made";

  for (int64_t clock = 1; clock <= 3; ++clock) {
    Answer<tessera::v1::AdvanceClockResponse> first, second;
    Advance(0, clock, first);
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(first.Ready()) << "SYNC: worker 0 waits at clock " << clock << " for worker 1";
    Advance(1, clock, second);
    ASSERT_THAT(first.Get(), IsOk());
    ASSERT_THAT(second.Get(), IsOk());
  }
  EXPECT_EQ(coordinator_->clocks(), (std::vector<int64_t>{3, 3}));
  ASSERT_THAT(Done(0, 3), IsOk());
  EXPECT_FALSE(coordinator_->finished());
  ASSERT_THAT(Done(1, 3), IsOk());
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(outcome_.completed) << outcome_.stop_reason;
  EXPECT_TRUE(coordinator_->finished());
  EXPECT_EQ(coordinator_->summary()["completed"], true);
  EXPECT_EQ(servers_.shutdowns(), 1);
}

TEST_F(JobCoordinatorTest, APlacementTheServersRefusedIsNotRecordedAndIsMadeAgainLater) {
  Create(ConsistencySpec::ASYNC, 10);
  RegisterEveryone();
  servers_.FailAssign(absl::UnavailableError("server 1 at 127.0.0.1:7001: connection refused"));
  EXPECT_THAT(Declare(0).status(), StatusIs(absl::StatusCode::kUnavailable, "server 1"));
  EXPECT_THAT(coordinator_->GetShardMap().status(), StatusIs(absl::StatusCode::kFailedPrecondition, ""))
      << "a placement no server holds is never the job's";
  servers_.FailAssign(absl::OkStatus());
  absl::StatusOr<tessera::v1::ShardMap> map = Declare(0);
  ASSERT_THAT(map, IsOk());
  EXPECT_EQ(servers_.assigned().epoch(), map->epoch());
  ASSERT_THAT(coordinator_->GetShardMap(), IsOk());
  EXPECT_EQ(coordinator_->GetShardMap()->epoch(), map->epoch());
  coordinator_->Abort("end of test");
}

TEST_F(JobCoordinatorTest, ALostWorkerNoLongerHoldsTheSyncGateAndTheOtherFinishesTheJob) {
  Create(ConsistencySpec::SYNC, 2, /*heartbeat_timeout=*/absl::Milliseconds(1000));
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  Answer<tessera::v1::AdvanceClockResponse> waiting;
  Advance(0, 1, waiting);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(waiting.Ready());
  // Worker 1 falls silent; the servers and worker 0 keep beating. A failure-detection pass after the timeout
  // declares worker 1 lost, and only it.
  absl::SleepFor(absl::Milliseconds(700));
  Beat({{tessera::v1::SERVER, 0}, {tessera::v1::SERVER, 1}, {tessera::v1::WORKER, 0}});
  absl::SleepFor(absl::Milliseconds(700));
  coordinator_->CheckLiveness(absl::Now());
  ASSERT_THAT(waiting.Get(), IsOk()) << "worker 1 was lost: worker 0 goes on alone";
  Answer<tessera::v1::AdvanceClockResponse> next;
  Advance(0, 2, next);
  ASSERT_THAT(next.Get(), IsOk());
  ASSERT_THAT(Done(0, 2), IsOk());
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_NE(coordinator_->summary().dump().find("worker lost"), std::string::npos) << coordinator_->summary().dump();
}

// The gate's values keeper (what rank 0 sends while it is there) is the lowest-ranked live worker that started
// before the clock the gate opens: worker 1 while worker 0 is lost, and worker 0 again once it has rejoined and
// started before the gate's clock.
TEST_F(JobCoordinatorTest, TheGateNamesTheLowestLiveWorkerThatStartedBeforeItsClockAsKeeper) {
  Create(ConsistencySpec::SYNC, 20, /*heartbeat_timeout=*/absl::Milliseconds(1000));
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  {
    Answer<tessera::v1::AdvanceClockResponse> first, second;
    Advance(0, 1, first);
    Advance(1, 1, second);
    ASSERT_THAT(first.Get(), IsOk());
    ASSERT_THAT(second.Get(), IsOk());
    EXPECT_EQ(first.Get()->values_keeper(), 0);
    EXPECT_EQ(second.Get()->values_keeper(), 0);
  }
  Answer<tessera::v1::AdvanceClockResponse> alone;
  Advance(1, 2, alone);
  absl::SleepFor(absl::Milliseconds(700));  // worker 0 falls silent
  Beat({{tessera::v1::SERVER, 0}, {tessera::v1::SERVER, 1}, {tessera::v1::WORKER, 1}});
  absl::SleepFor(absl::Milliseconds(700));
  coordinator_->CheckLiveness(absl::Now());
  ASSERT_THAT(alone.Get(), IsOk());
  EXPECT_EQ(alone.Get()->values_keeper(), 1) << "worker 0 is lost";
  absl::StatusOr<tessera::v1::RegisterResponse> back = Register(tessera::v1::WORKER, 0);
  ASSERT_THAT(back, IsOk());
  const int64_t start = back->start_clock();
  // Worker 1 reaches the joiner's start clock: the gate that opens it still names worker 1, which holds the values
  // of that clock; the next one names worker 0 again.
  for (int64_t clock = 3; clock <= start; ++clock) {
    Answer<tessera::v1::AdvanceClockResponse> step;
    Advance(1, clock, step);
    ASSERT_THAT(step.Get(), IsOk());
    EXPECT_EQ(step.Get()->values_keeper(), 1) << "clock " << clock << ", worker 0 starts at " << start;
  }
  Answer<tessera::v1::AdvanceClockResponse> rejoined, other;
  Advance(0, start + 1, rejoined);
  Advance(1, start + 1, other);
  ASSERT_THAT(rejoined.Get(), IsOk());
  ASSERT_THAT(other.Get(), IsOk());
  EXPECT_EQ(rejoined.Get()->values_keeper(), 0);
  EXPECT_EQ(other.Get()->values_keeper(), 0);
  coordinator_->Abort("end of test");
}

// A worker registering while a server is slow to take the view (frozen: the servers learn the worker's key
// before it hears back): the wait is the scheduler's, not the worker's silence. It is not lost at the first check
// after its answer, only once it stays silent for the timeout from then.
TEST_F(JobCoordinatorTest, AWorkerIsNotLostWhileItsRegistrationWaitsForTheServers) {
  Create(ConsistencySpec::ASYNC, 100, /*heartbeat_timeout=*/absl::Milliseconds(500));
  ASSERT_THAT(Register(tessera::v1::SERVER, 0), IsOk());
  ASSERT_THAT(Register(tessera::v1::SERVER, 1), IsOk());
  ASSERT_THAT(Register(tessera::v1::WORKER, 0), IsOk());
  ASSERT_THAT(Declare(0), IsOk());
  servers_.SlowAssigns(absl::Milliseconds(800));
  const absl::Time joined = absl::Now();
  ASSERT_THAT(Register(tessera::v1::WORKER, 1), IsOk());
  ASSERT_GE(absl::Now() - joined, absl::Milliseconds(800));
  const std::vector<std::pair<tessera::v1::Role, int>> others = {
      {tessera::v1::SERVER, 0}, {tessera::v1::SERVER, 1}, {tessera::v1::WORKER, 0}};
  Beat(others);
  coordinator_->CheckLiveness(absl::Now());
  EXPECT_EQ(coordinator_->view().Workers()[1].state, MemberState::kAlive);
  absl::SleepFor(absl::Milliseconds(600));
  Beat(others);
  coordinator_->CheckLiveness(absl::Now());
  EXPECT_EQ(coordinator_->view().Workers()[1].state, MemberState::kLost);
  EXPECT_EQ(coordinator_->view().Workers()[0].state, MemberState::kAlive);
}

// The job's end: worker 0's evaluation reaches the target, worker 1 is done, and then, while worker 0 still
// finishes, both servers fall silent and are reported. The verdict "completed" stands: no server is declared lost
// on a report after the stop, a server lost by its silence is no failure, and worker 0's failed last pull makes it
// done, not lost.
TEST_F(JobCoordinatorTest, AJobThatReachedItsTargetStaysCompletedWhenItsServersGoAway) {
  job_.mutable_stop()->set_target_accuracy(0.5);
  Create(ConsistencySpec::SYNC, /*max_steps=*/100, /*heartbeat_timeout=*/absl::Milliseconds(500));
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  absl::StatusOr<tessera::v1::ReportResponse> answer = coordinator_->Report(Evaluation(0, 5, 0.75));
  ASSERT_THAT(answer, IsOk());
  EXPECT_TRUE(answer->stop()) << "the target is reached";
  ASSERT_THAT(Done(1, 5), IsOk());

  servers_.AnswerProbes(absl::UnavailableError("connection refused"));
  for (int server = 0; server < 2; ++server) {
    tessera::v1::ReportServerRequest report;
    report.set_role(tessera::v1::WORKER);
    report.set_member_id(0);
    report.set_server_id(server);
    report.set_error("UCX send: Endpoint is not connected");
    ASSERT_THAT(coordinator_->ReportServer(report), IsOk());
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(coordinator_->StatusJson()["servers"][0]["state"], "alive") << "a report after the stop moves nothing";
  // Worker 0 keeps beating while it finishes; the servers are silent past the heartbeat timeout.
  for (int i = 0; i < 8; ++i) {
    Beat({{tessera::v1::WORKER, 0}});
    absl::SleepFor(absl::Milliseconds(100));
  }
  coordinator_->CheckLiveness(absl::Now());
  tessera::v1::DoneRequest failed;
  failed.set_worker_id(0);
  failed.set_clock(5);
  failed.set_failure("ABORTED: the job is stopping: UCX send: Endpoint is not connected");
  ASSERT_THAT(coordinator_->Done(failed), IsOk());
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(outcome_.completed) << outcome_.stop_reason;
  const nlohmann::json summary = coordinator_->summary();
  EXPECT_TRUE(summary["completed"].get<bool>()) << summary.dump();
  EXPECT_EQ(summary["lost_workers"], nlohmann::json::array()) << summary.dump();
  EXPECT_NE(summary.dump().find("worker stopped with the job"), std::string::npos) << summary.dump();
}

// A job that reached its target, with a worker that never finishes (stuck on a call to a server that died):
// it ends completed, without that worker, twice the heartbeat timeout after the stop; it does not wait forever.
TEST_F(JobCoordinatorTest, AJobThatReachedItsTargetEndsCompletedWhenAWorkerNeverFinishes) {
  job_.mutable_stop()->set_target_accuracy(0.5);
  Create(ConsistencySpec::SYNC, /*max_steps=*/100, /*heartbeat_timeout=*/absl::Milliseconds(500));
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  coordinator_->StartFailureDetection();
  ASSERT_THAT(coordinator_->Report(Evaluation(0, 5, 0.75)), IsOk());
  const absl::Time stopped = absl::Now();
  ASSERT_THAT(Done(1, 5), IsOk());
  // Worker 0 stays alive (it beats) and never says Done.
  while (!finished_.HasBeenNotified() && absl::Now() - stopped < absl::Seconds(20)) {
    Beat({{tessera::v1::WORKER, 0}});
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(finished_.HasBeenNotified()) << "the job waited for worker 0 past 20 s";
  EXPECT_GE(absl::Now() - stopped, absl::Milliseconds(900)) << "a grace of twice the heartbeat timeout";
  EXPECT_TRUE(outcome_.completed) << outcome_.stop_reason;
  EXPECT_EQ(coordinator_->summary()["lost_workers"], nlohmann::json::array()) << coordinator_->summary().dump();
}

// A job whose every worker has run its last step is complete: a stop asked for then (a signal) does not make it
// a failure.
TEST_F(JobCoordinatorTest, AStopAskedForAfterEveryWorkerRanItsCourseLeavesTheJobCompleted) {
  Create(ConsistencySpec::ASYNC, /*max_steps=*/2);
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  for (int worker = 0; worker < 2; ++worker) {
    for (int64_t clock = 1; clock <= 2; ++clock) {
      Answer<tessera::v1::AdvanceClockResponse> gate;
      Advance(worker, clock, gate);
      ASSERT_THAT(gate.Get(), IsOk());
    }
  }
  ASSERT_THAT(Done(1, 2), IsOk());
  coordinator_->Abort("stopped by SIGTERM");  // worker 0 is past its last step, finishing
  ASSERT_THAT(Done(0, 2), IsOk());
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(outcome_.completed) << outcome_.stop_reason;
}

// A worker that stops on an error while the job runs is lost (it may come back); one whose calls fail once the
// job stopped is done.
TEST_F(JobCoordinatorTest, AWorkerThatFailsAfterTheJobStoppedIsDoneNotLost) {
  Create(ConsistencySpec::ASYNC, /*max_steps=*/100);
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  coordinator_->Abort("server 1 lost; its chunks cannot be restored without a checkpoint, so the job stops");
  for (int worker = 0; worker < 2; ++worker) {
    tessera::v1::DoneRequest failed;
    failed.set_worker_id(worker);
    failed.set_clock(3);
    failed.set_failure("CANCELLED: the job is stopping");
    ASSERT_THAT(coordinator_->Done(failed), IsOk());
  }
  ASSERT_TRUE(finished_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(outcome_.completed);
  EXPECT_EQ(coordinator_->summary()["lost_workers"], nlohmann::json::array()) << coordinator_->summary().dump();
  EXPECT_EQ(coordinator_->StatusJson()["workers"][1]["state"], "done");
}

// A worker that stops on an error leaves through the view's event: the records name its error, the gate lets
// the other go on, and the servers get a view without it.
TEST_F(JobCoordinatorTest, AWorkerThatFailedIsRecordedWithItsErrorAndLeavesTheGate) {
  Create(ConsistencySpec::SYNC, 2);
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  const int assigns = servers_.assigns();
  Answer<tessera::v1::AdvanceClockResponse> waiting;
  Advance(0, 1, waiting);
  tessera::v1::DoneRequest failed;
  failed.set_worker_id(1);
  failed.set_clock(0);
  failed.set_failure("INTERNAL: CUDA error: out of memory");
  ASSERT_THAT(coordinator_->Done(failed), IsOk());
  ASSERT_THAT(waiting.Get(), IsOk()) << "worker 1 left: worker 0 goes on alone";
  const nlohmann::json status = coordinator_->StatusJson();
  ASSERT_FALSE(status["events"].empty()) << status.dump();
  EXPECT_EQ(status["events"].back()["event"], "worker failed");
  EXPECT_EQ(status["events"].back()["error"], "INTERNAL: CUDA error: out of memory");
  EXPECT_EQ(status["workers"][1]["state"], "lost");
  for (int i = 0; i < 100 && servers_.assigns() == assigns; ++i) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GT(servers_.assigns(), assigns) << "the servers are handed the view without worker 1";
  coordinator_->Abort("end of test");
}

// A server lost before any checkpoint: its chunks cannot come back, so the job stops naming it, and the gate
// says stop to the worker waiting there.
TEST_F(JobCoordinatorTest, AServerLostWithoutACheckpointStopsTheJobNamingIt) {
  Create(ConsistencySpec::SYNC, 100, /*heartbeat_timeout=*/absl::Milliseconds(1000));
  RegisterEveryone();
  ASSERT_THAT(Declare(0), IsOk());
  absl::SleepFor(absl::Milliseconds(700));
  Beat({{tessera::v1::SERVER, 0}, {tessera::v1::WORKER, 0}, {tessera::v1::WORKER, 1}});
  absl::SleepFor(absl::Milliseconds(700));
  coordinator_->CheckLiveness(absl::Now());
  Answer<tessera::v1::AdvanceClockResponse> gate;
  Advance(0, 1, gate);
  absl::StatusOr<tessera::v1::AdvanceClockResponse> answer = gate.Get();
  ASSERT_THAT(answer, IsOk());
  EXPECT_TRUE(answer->stop());
  EXPECT_NE(answer->stop_reason().find("server 1"), std::string::npos) << answer->stop_reason();
  EXPECT_NE(answer->stop_reason().find("without a checkpoint"), std::string::npos) << answer->stop_reason();
  EXPECT_EQ(coordinator_->StatusJson()["events"].back()["event"], "server lost");
  coordinator_->Abort("end of test");
}

// What a member sends a restarted scheduler to come back: its slot, incarnation and state, and (servers) the same
// address and control key.
tessera::v1::RegisterRequest Rejoin(tessera::v1::Role role, int id, const std::string& job, uint64_t incarnation,
                                    const tessera::v1::ShardMap& view, int64_t clock) {
  tessera::v1::RegisterRequest r = Registration(role, id);
  r.mutable_rejoin()->set_job(job);
  r.mutable_rejoin()->set_incarnation(incarnation);
  *r.mutable_rejoin()->mutable_view() = view;
  r.mutable_rejoin()->set_clock(clock);
  return r;
}

// A scheduler restarted in the middle of a SYNC job takes it back from its members: the servers' view (same
// placement, a newer epoch handed to them), each worker's clock; it knows nobody before they come back, takes
// only their own keys, waits for the servers first, and a member that does not come back is lost like a silent one.
TEST_F(JobCoordinatorTest, ARestartedSchedulerTakesTheJobBackFromItsMembers) {
  Create(ConsistencySpec::SYNC, /*max_steps=*/100, /*heartbeat_timeout=*/absl::Seconds(5));
  std::string keys[2][2];  // [server/worker][id]
  ASSERT_NO_FATAL_FAILURE(RegisterEveryone(keys));
  ASSERT_THAT(Declare(0), IsOk());
  for (int64_t clock = 1; clock <= 3; ++clock) {
    Answer<tessera::v1::AdvanceClockResponse> a0, a1;
    Advance(0, clock, a0);
    Advance(1, clock, a1);
    ASSERT_THAT(a0.Get(), IsOk());
    ASSERT_THAT(a1.Get(), IsOk());
  }
  const tessera::v1::ShardMap held = servers_.assigned();  // what the servers hold when the scheduler dies
  coordinator_->Abort("the scheduler process died");

  FakeServerControl servers;
  auto created = JobCoordinator::Create(job_, /*run_dir=*/"", absl::Milliseconds(100), absl::Seconds(1), &servers,
                                        [](const JobOutcome&) {});
  ASSERT_THAT(created, IsOk());
  JobCoordinator& restarted = **created;
  auto come_back = [&](const tessera::v1::RegisterRequest& r, const std::string& key) {
    Answer<tessera::v1::RegisterResponse> answer;
    restarted.Register(r, answer.callback(), key);
    return answer.Get();
  };
  EXPECT_THAT(restarted.view().CheckMemberKey(tessera::v1::WORKER, 0, keys[1][0]),
              StatusIs(absl::StatusCode::kNotFound, "register first"))
      << "a member unknown to the scheduler is told so, and comes back";
  EXPECT_THAT(come_back(Rejoin(tessera::v1::WORKER, 0, job_.name(), 1, held, 3), keys[1][0]),
              StatusIs(absl::StatusCode::kUnavailable, "servers first"));
  EXPECT_THAT(come_back(Rejoin(tessera::v1::SERVER, 0, "another-job", 1, held, 0), keys[0][0]),
              StatusIs(absl::StatusCode::kFailedPrecondition, "another-job"));
  tessera::v1::ShardMap forged = held;
  forged.mutable_chunks(0)->set_server_id(7);
  EXPECT_THAT(come_back(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, forged, 0), keys[0][0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the job"))
      << "a view from the wire is checked before anything is taken from it";
  EXPECT_THAT(come_back(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, held, 0), keys[0][0]),
              StatusIs(absl::StatusCode::kUnavailable, "server(s) 1"))
      << "the view is taken once every server it names is back";
  tessera::v1::RegisterRequest fresh;
  fresh.set_role(tessera::v1::WORKER);
  Answer<tessera::v1::RegisterResponse> afresh;
  restarted.Register(fresh, afresh.callback());
  EXPECT_THAT(afresh.Get(), StatusIs(absl::StatusCode::kUnavailable, "taking its job back"));
  ASSERT_THAT(come_back(Rejoin(tessera::v1::SERVER, 1, job_.name(), 1, held, 0), keys[0][1]), IsOk());

  // The view taken back: the same placement and members, under a new epoch, handed to the servers.
  std::optional<tessera::v1::ShardMap> view = restarted.view().Map();
  ASSERT_TRUE(view.has_value());
  EXPECT_GT(view->epoch(), held.epoch());
  EXPECT_EQ(servers.assigned().epoch(), view->epoch());
  ASSERT_EQ(view->chunks_size(), held.chunks_size());
  for (int i = 0; i < held.chunks_size(); ++i) EXPECT_EQ(view->chunks(i).server_id(), held.chunks(i).server_id());
  EXPECT_THAT(restarted.view().CheckMemberKey(tessera::v1::SERVER, 1, keys[0][1]), IsOk());
  EXPECT_THAT(restarted.view().CheckMemberKey(tessera::v1::WORKER, 1, keys[1][1]),
              StatusIs(absl::StatusCode::kNotFound, "not come back"));

  // Workers come back with their own keys and clocks; the gate waits for the one not back yet.
  EXPECT_THAT(come_back(Rejoin(tessera::v1::WORKER, 0, job_.name(), 1, held, 3), keys[1][1]),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
  EXPECT_THAT(come_back(Rejoin(tessera::v1::WORKER, 0, job_.name(), 1, held, 3), keys[1][0]), IsOk());
  Answer<tessera::v1::AdvanceClockResponse> gate;
  tessera::v1::AdvanceClockRequest advance;
  advance.set_worker_id(0);
  advance.set_clock(4);
  advance.set_wait_timeout_ms(30000);
  restarted.AdvanceClock(advance, gate.callback());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(gate.Ready()) << "worker 1's clock is not known yet";
  // Worker 1 never comes back: lost after the heartbeat timeout, and the gate opens without it.
  for (int beat = 0; beat < 6; ++beat) {
    absl::SleepFor(absl::Milliseconds(250));
    for (auto [role, id] : std::vector<std::pair<tessera::v1::Role, int>>{
             {tessera::v1::SERVER, 0}, {tessera::v1::SERVER, 1}, {tessera::v1::WORKER, 0}}) {
      tessera::v1::HeartbeatRequest r;
      r.set_role(role);
      r.set_id(id);
      r.set_incarnation(1);
      ASSERT_THAT(restarted.Heartbeat(r), IsOk());
    }
  }
  EXPECT_FALSE(gate.Ready());
  restarted.CheckLiveness(absl::Now());
  absl::StatusOr<tessera::v1::AdvanceClockResponse> opened = gate.Get();
  ASSERT_THAT(opened, IsOk());
  EXPECT_FALSE(opened->stop()) << opened->stop_reason();
  EXPECT_EQ(restarted.view().Workers()[1].state, MemberState::kLost);
  EXPECT_EQ(restarted.clocks()[0], 4);
  restarted.Abort("end of test");
}

// A scheduler that started its job afresh does not take members of another life back.
TEST_F(JobCoordinatorTest, AMemberOfAnEarlierLifeCannotComeBackToAJobStartedAfresh) {
  Create(ConsistencySpec::ASYNC, /*max_steps=*/10);
  ASSERT_THAT(Register(tessera::v1::SERVER, 0), IsOk());
  Answer<tessera::v1::RegisterResponse> answer;
  coordinator_->Register(Rejoin(tessera::v1::SERVER, 1, job_.name(), 1, tessera::v1::ShardMap(), 0),
                         answer.callback(), "some-key");
  EXPECT_THAT(answer.Get(), StatusIs(absl::StatusCode::kFailedPrecondition, "afresh"));
  coordinator_->Abort("end of test");
}

// A scheduler restarted on its unfinished run directory keeps the run's records: the events of its first life
// come first in its own, on the run's clock, and its records are added to the run's files.
TEST_F(JobCoordinatorTest, ARestartedSchedulerKeepsTheEventsOfItsFirstLife) {
  Create(ConsistencySpec::ASYNC, /*max_steps=*/10);
  const std::string run_dir = ::testing::TempDir() + "/restarted-records";
  std::filesystem::remove_all(run_dir);
  {
    auto first = JobCoordinator::Create(job_, run_dir, absl::Milliseconds(100), absl::Seconds(5), &servers_,
                                        [](const JobOutcome&) {});
    ASSERT_THAT(first, IsOk());
    tessera::v1::RegisterRequest r;
    r.set_role(tessera::v1::WORKER);
    r.set_requested_id(0);
    Answer<tessera::v1::RegisterResponse> answer;
    (*first)->Register(r, answer.callback());
    ASSERT_THAT(answer.Get(), IsOk());
    tessera::v1::DoneRequest done;
    done.set_worker_id(0);
    done.set_failure("INTERNAL: out of memory");
    ASSERT_THAT((*first)->Done(done), IsOk());
    (*first)->Abort("the scheduler process died");
  }
  ASSERT_TRUE(UnfinishedRun(run_dir));
  absl::SleepFor(absl::Milliseconds(50));
  auto second = JobCoordinator::Create(job_, run_dir, absl::Milliseconds(100), absl::Seconds(5), &servers_,
                                       [](const JobOutcome&) {}, /*resume_dir=*/"", /*interrupted_run=*/true);
  ASSERT_THAT(second, IsOk());
  const nlohmann::json events = (*second)->StatusJson()["events"];
  ASSERT_FALSE(events.empty()) << events.dump();
  EXPECT_EQ(events[0]["event"], "worker failed") << events.dump();
  EXPECT_EQ(events[0]["error"], "INTERNAL: out of memory");
  // A registration afresh waits for the run's members to come back first.
  tessera::v1::RegisterRequest fresh;
  fresh.set_role(tessera::v1::SERVER);
  fresh.set_address("127.0.0.1:7100");
  fresh.set_control_key("control");
  Answer<tessera::v1::RegisterResponse> answer;
  (*second)->Register(fresh, answer.callback());
  EXPECT_THAT(answer.Get(), StatusIs(absl::StatusCode::kUnavailable, "unfinished run"));
  (*second)->Abort("end of test");
  coordinator_->Abort("end of test");
  std::filesystem::remove_all(run_dir);
}

// What a restarted scheduler needs of a member before it takes anything the member brings back.
class TakeBackTest : public JobCoordinatorTest {
 protected:
  // Runs a SYNC job to clock 3, then "restarts" the scheduler: `restarted_` knows nobody, `held_` is the view the
  // servers hold, keys_[server/worker][id] the members' keys.
  void RunThenRestart(int max_seconds = 0) {
    Create(ConsistencySpec::SYNC, /*max_steps=*/100, /*heartbeat_timeout=*/absl::Seconds(5));
    ASSERT_NO_FATAL_FAILURE(RegisterEveryone(keys_));
    ASSERT_THAT(Declare(0), IsOk());
    held_ = servers_.assigned();
    coordinator_->Abort("the scheduler process died");
    tessera::v1::JobSpec job = job_;
    job.mutable_stop()->set_max_seconds(max_seconds);
    auto created = JobCoordinator::Create(job, /*run_dir=*/"", absl::Milliseconds(100), absl::Seconds(5),
                                          &restarted_servers_, [this](const JobOutcome&) { ended_.Notify(); });
    ASSERT_THAT(created, IsOk());
    restarted_ = std::move(*created);
  }
  absl::StatusOr<tessera::v1::RegisterResponse> ComeBack(const tessera::v1::RegisterRequest& r, const std::string& key) {
    Answer<tessera::v1::RegisterResponse> answer;
    restarted_->Register(r, answer.callback(), key);
    return answer.Get();
  }
  void TearDown() override {
    if (restarted_) restarted_->Abort("end of test");
  }

  std::string keys_[2][2];
  tessera::v1::ShardMap held_;
  FakeServerControl restarted_servers_;
  absl::Notification ended_;
  std::unique_ptr<JobCoordinator> restarted_;
};

// A view counts only once the key of the server bringing it matches the digest that very view holds for the
// server's own slot: a forged view (a newer epoch, another run) with no key, another member's key, or naming
// another incarnation is refused UNAUTHENTICATED and leaves nothing behind; the job is taken back under the real
// view's run and an epoch just past it.
TEST_F(TakeBackTest, NothingAServerBringsBackCountsBeforeItsKeyIsChecked) {
  RunThenRestart();
  tessera::v1::ShardMap forged = held_;
  forged.set_epoch(1002);
  forged.set_run_id("holdout-forged");
  const std::string real_run = held_.run_id();
  ASSERT_FALSE(real_run.empty());
  for (const std::string& key : {std::string(), std::string("a-guess"), keys_[1][0], keys_[0][1]}) {
    EXPECT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, forged, 0), key),
                StatusIs(absl::StatusCode::kUnauthenticated, "")) << "key '" << key << "'";
  }
  EXPECT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 2, forged, 0), keys_[0][0]),
              StatusIs(absl::StatusCode::kUnauthenticated, "incarnation"));
  tessera::v1::ShardMap unnamed = forged;
  unnamed.mutable_servers()->DeleteSubrange(0, 1);
  EXPECT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, unnamed, 0), keys_[0][0]),
              StatusIs(absl::StatusCode::kUnauthenticated, "does not name it"));
  for (uint64_t incarnation : {uint64_t{0}, kMaxIncarnation + 1, ~uint64_t{0}}) {
    tessera::v1::ShardMap beyond = held_;
    beyond.mutable_servers(0)->set_incarnation(incarnation == 0 ? 1 : incarnation);
    EXPECT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), incarnation, beyond, 0), keys_[0][0]),
                StatusIs(incarnation == 0 ? absl::StatusCode::kUnauthenticated : absl::StatusCode::kInvalidArgument, ""))
        << incarnation;
  }
  tessera::v1::RegisterRequest no_role = Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, held_, 0);
  no_role.set_role(tessera::v1::ROLE_UNSPECIFIED);
  EXPECT_THAT(ComeBack(no_role, keys_[0][0]), StatusIs(absl::StatusCode::kInvalidArgument, "SERVER or a WORKER"));
  EXPECT_FALSE(restarted_->view().Map().has_value()) << "nothing above was taken";

  // Server 1 comes back first with a view of another run it vouches for: the run brought back first wins a tie.
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, held_, 0), keys_[0][0]),
              StatusIs(absl::StatusCode::kUnavailable, "server(s) 1"));
  EXPECT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, held_, 0), "another-process"),
              StatusIs(absl::StatusCode::kUnauthenticated, ""));
  tessera::v1::ShardMap other_run = held_;
  other_run.set_epoch(1002);
  other_run.set_run_id("holdout-forged");
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 1, job_.name(), 1, other_run, 0), keys_[0][1]), IsOk());
  std::optional<tessera::v1::ShardMap> view = restarted_->view().Map();
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->run_id(), real_run);
  EXPECT_GT(view->epoch(), held_.epoch());
  EXPECT_LT(view->epoch(), 1002u);
}

// A rank the view taken back holds goes to its own key only: a token holder naming any incarnation (2^64-1
// included) with another key is refused, and the real worker comes back afterwards.
TEST_F(TakeBackTest, AnAwaitedRankGoesToItsOwnKeyOnly) {
  RunThenRestart();
  EXPECT_THAT(restarted_->GetShardMap(), StatusIs(absl::StatusCode::kUnavailable, "come back"))
      << "a worker asking before the job is back waits";
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, held_, 0), keys_[0][0]),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  EXPECT_THAT(restarted_->GetShardMap(), StatusIs(absl::StatusCode::kUnavailable, "come back"));
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 1, job_.name(), 1, held_, 0), keys_[0][1]), IsOk());
  for (uint64_t incarnation : {~uint64_t{0}, uint64_t{1} << 63, kMaxIncarnation + 1}) {
    EXPECT_THAT(ComeBack(Rejoin(tessera::v1::WORKER, 0, job_.name(), incarnation, held_, 3), "forged"),
                StatusIs(absl::StatusCode::kInvalidArgument, "incarnation")) << incarnation;
  }
  for (uint64_t incarnation : {uint64_t{1}, uint64_t{2}, kMaxIncarnation}) {
    EXPECT_THAT(ComeBack(Rejoin(tessera::v1::WORKER, 0, job_.name(), incarnation, held_, 3), "forged"),
                StatusIs(absl::StatusCode::kUnauthenticated, "")) << incarnation;
  }
  EXPECT_THAT(ComeBack(Rejoin(tessera::v1::WORKER, 0, job_.name(), 1, held_, -1), keys_[1][0]),
              StatusIs(absl::StatusCode::kInvalidArgument, "clock"));
  EXPECT_THAT(ComeBack(Rejoin(tessera::v1::WORKER, 0, job_.name(), 1, held_, 3), keys_[1][0]), IsOk());
  EXPECT_THAT(restarted_->GetShardMap(), IsOk());
}

// stop.max_seconds ends a job whose ranks nobody holds (its workers never came back to the restarted scheduler).
TEST_F(TakeBackTest, StopMaxSecondsEndsAJobWaitingForWorkers) {
  RunThenRestart(/*max_seconds=*/1);
  restarted_->StartFailureDetection();
  // Nothing placed comes back: every rank stays vacant.
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 0, job_.name(), 1, tessera::v1::ShardMap(), 0), keys_[0][0]),
              StatusIs(absl::StatusCode::kUnavailable, ""));
  ASSERT_THAT(ComeBack(Rejoin(tessera::v1::SERVER, 1, job_.name(), 1, tessera::v1::ShardMap(), 0), keys_[0][1]),
              IsOk());
  EXPECT_TRUE(ended_.WaitForNotificationWithTimeout(absl::Seconds(20)))
      << "the job did not end 20 s into a 1 s stop.max_seconds: " << restarted_->StatusJson().dump();
}

}  // namespace
}  // namespace tessera

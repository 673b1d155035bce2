#include "scheduler/job_coordinator.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/daemon/http_endpoint.h"
#include "common/model/job_spec.h"
#include "common/daemon/metrics_page.h"
#include "common/model/shard_map.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"
#include "glog/logging.h"

namespace tessera {

namespace {
// How long a server a worker could not reach has to answer the scheduler before it is declared lost.
constexpr absl::Duration kServerProbeTimeout = absl::Seconds(1);
}  // namespace

using tessera::v1::ConsistencySpec;


absl::StatusOr<std::unique_ptr<JobCoordinator>> JobCoordinator::Create(
    tessera::v1::JobSpec job, const std::string& run_dir, absl::Duration heartbeat_interval,
    absl::Duration heartbeat_timeout, ServerControl* servers, std::function<void(const JobOutcome&)> on_finished,
    const std::string& resume_dir, bool interrupted_run) {
  TESSERA_RETURN_IF_ERROR(ValidateJobSpec(job));
  std::optional<CheckpointInfo> resume;
  if (!resume_dir.empty()) {
    absl::StatusOr<CheckpointInfo> latest = Checkpointer::LoadLatest(resume_dir, job.name());
    if (!latest.ok()) return Annotate(latest.status(), "cannot resume");
    TESSERA_RETURN_IF_ERROR(Checkpointer::CheckResumable(job, *latest));
    resume = std::move(latest).value();
  }
  // A restarted scheduler's run began with its first life: its events and its clock go on from there.
  std::vector<nlohmann::json> earlier_events;
  if (interrupted_run) earlier_events = RunRecorder::ReadEvents(run_dir);
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<RunRecorder> recorder,
                           RunRecorder::Create(run_dir, /*append=*/resume.has_value() || interrupted_run));
  std::unique_ptr<JobCoordinator> coordinator(new JobCoordinator(
      std::move(job), std::move(recorder), heartbeat_interval, heartbeat_timeout, servers, std::move(on_finished)));
  if (interrupted_run) {
    coordinator->records_.TakeBackEvents(std::move(earlier_events));
    coordinator->take_back_.ExpectMembersUntil(absl::Now() + heartbeat_timeout);
  }
  if (resume) {
    const CheckpointInfo& info = *resume;
    coordinator->view_.Restore(info.state.view());
    for (int w = 0; w < info.state.worker_clocks_size(); ++w) coordinator->clocks_.Rejoin(w, info.state.worker_clocks(w));
    coordinator->checkpointer_.set_latest(info);
    coordinator->records_.AddEvent({{"event", "resumed"}, {"checkpoint", info.folder}, {"clock", info.state.clock()}});
    LOG(INFO) << "resuming job '" << coordinator->job_.name() << "' from " << info.folder << " at clock "
              << info.state.clock();
    absl::MutexLock lock(&coordinator->mu_);
    coordinator->resume_ = std::move(resume);
  }
  return coordinator;
}

JobCoordinator::JobCoordinator(tessera::v1::JobSpec job, std::unique_ptr<RunRecorder> recorder,
                               absl::Duration heartbeat_interval, absl::Duration heartbeat_timeout,
                               ServerControl* servers, std::function<void(const JobOutcome&)> on_finished)
    : job_(std::move(job)),
      heartbeat_interval_(heartbeat_interval),
      servers_(servers),
      start_(absl::Now()),
      view_(job_.cluster().num_servers(), job_.cluster().num_workers(), job_.replication().backups()),
      rules_(ModeRules::ForJob(job_.consistency())),
      clocks_(job_.cluster().num_workers(), rules_.gate_bound, rules_.backup_workers,
              [this](const RoundMembers& round) { OnRoundDecided(round); }),
      balancer_(job_),
      records_(job_, std::move(recorder), start_),
      failure_detector_(&view_, heartbeat_timeout),
      checkpointer_(job_, servers, start_),
      recovery_({&job_, &rules_, &view_, &clocks_, servers, &checkpointer_, &records_, &executor_}, heartbeat_timeout,
                [this](const std::string& why) { return TakeCheckpoint(why, /*keep_hold=*/true); },
                [this](const std::string& reason) { end_.Fail(reason); }),
      moves_({&job_, &rules_, &view_, &clocks_, servers, &checkpointer_, &records_, &executor_}),
      take_back_({&job_, &view_, &clocks_, servers, &checkpointer_, &records_}, heartbeat_interval,
                 [this](const std::string& why) { PublishView(why); }),
      pages_(job_, start_, view_, clocks_, balancer_, records_, checkpointer_),
      end_({&job_, &view_, &clocks_, &balancer_, &records_, &pages_, servers, &executor_}, heartbeat_timeout,
           std::move(on_finished)) {
  // The parts that care hear of every membership change, in this order.
  view_.Subscribe([this](const MembershipEvent& e) {
    const std::vector<int64_t> clocks = clocks_.Clocks();
    const int id = e.member.id;
    records_.OnMembership(e, id >= 0 && id < static_cast<int>(clocks.size()) ? clocks[id] : 0);
  });
  view_.Subscribe([this](const MembershipEvent& e) { clocks_.OnMembership(e); });
  view_.Subscribe([this](const MembershipEvent& e) { balancer_.OnMembership(e); });
  // Every new split is an event (events.jsonl): the shares over time, and what they were made from.
  balancer_.SetRebalanceListener(
      [this](int64_t round, const std::vector<int>& shares, const std::vector<double>& samples_per_sec) {
        records_.AddEvent({{"event", "rebalanced"}, {"round", round}, {"shares", shares},
                           {"samples_per_sec", samples_per_sec}});
      });
  view_.Subscribe([this](const MembershipEvent& e) { recovery_.OnMembership(e); });
  view_.Subscribe([this](const MembershipEvent& e) { moves_.OnMembership(e); });
  view_.Subscribe([this](const MembershipEvent& e) { OnMembership(e); });
}

JobCoordinator::~JobCoordinator() {
  failure_detector_.Stop();
  if (ticker_) ticker_->Stop();
}

void JobCoordinator::StartFailureDetection() {
  failure_detector_.Start(heartbeat_interval_);
  const int max_seconds = job_.stop().max_seconds();
  ticker_ = std::make_unique<Heartbeater>(
      std::min(heartbeat_interval_, absl::Milliseconds(200)),
      [this, max_seconds] {
        if (max_seconds > 0 && !clocks_.stopped() && absl::Now() - records_.run_start() >= absl::Seconds(max_seconds)) {
          end_.StopCompleted(absl::StrCat("ran for stop.max_seconds (", max_seconds, " s)"));
        }
        // A job end held for a failed worker's return, or a stopped job whose ranks nobody holds (a restarted
        // scheduler's job whose workers never came back): the stop rules end it.
        if (end_.FailureReportPending() || clocks_.stopped()) end_.MaybeFinish();
        end_.EndAStopNobodyFinishes();
        if (!checkpointer_.enabled()) return absl::OkStatus();
        const std::vector<int64_t> active = clocks_.ActiveClocks();
        if (active.empty() || clocks_.stopped() || !view_.placed()) return absl::OkStatus();
        if (!checkpointer_.Due(*std::min_element(active.begin(), active.end()), absl::Now())) return absl::OkStatus();
        {
          absl::MutexLock lock(&mu_);
          if (checkpoint_queued_ || end_.finishing()) return absl::OkStatus();
          checkpoint_queued_ = true;
        }
        executor_.Submit([this] {
          absl::StatusOr<CheckpointInfo> taken = TakeCheckpoint("cadence");
          if (!taken.ok()) {
            LOG(WARNING) << "checkpoint failed (tried again after a backoff): " << taken.status();
            records_.AddEvent({{"event", "checkpoint failed"}, {"error", taken.status().ToString()}});
          }
          absl::MutexLock lock(&mu_);
          checkpoint_queued_ = false;
        });
        return absl::OkStatus();
      },
      [](const absl::Status&) {}, absl::InfiniteDuration());
  ticker_->Start();
}

absl::StatusOr<CheckpointInfo> JobCoordinator::Checkpoint(const std::string& why) {
  absl::Notification done;
  absl::StatusOr<CheckpointInfo> result = absl::UnknownError("not taken");
  executor_.Submit([&] {
    result = TakeCheckpoint(why);
    done.Notify();
  });
  done.WaitForNotification();  // TakeCheckpoint's every wait has a deadline
  return result;
}

absl::StatusOr<CheckpointInfo> JobCoordinator::TakeCheckpoint(const std::string& why, bool keep_hold) {
  if (!checkpointer_.enabled()) {
    return absl::FailedPreconditionError("the job has no checkpoint.dir (scheduler --checkpoint_dir)");
  }
  std::optional<tessera::v1::ShardMap> map = view_.Map();
  if (!map) return absl::FailedPreconditionError("nothing to checkpoint: no parameters are declared yet");
  for (const auto& c : map->chunks()) {
    if (std::none_of(map->servers().begin(), map->servers().end(),
                     [&](const auto& s) { return s.id() == c.server_id(); })) {
      return absl::UnavailableError(absl::StrCat("server ", c.server_id(), " is lost and its chunks are not moved yet"));
    }
  }
  if (end_.finishing()) return absl::FailedPreconditionError("the job is finishing");
  const absl::Time start = absl::Now();
  const bool sync = rules_.consistent_cut;
  int64_t clock;
  std::vector<int64_t> worker_clocks = clocks_.Clocks();
  // Steps the workers may still have to make before the cut.
  const int ahead = sync && job_.optimizer().kind() == tessera::v1::OptimizerSpec::SCRIPT ? 2 : 1;
  if (sync) {
    // Everyone completes exactly `clock` steps and waits: every chunk's version is then `clock`. With the
    // script's optimizer the cut is one step further, announced to the workers as they enter the step before it
    // (GateAnswer), so that the values keeper saves its values for it then, and only then.
    clock = clocks_.Hold(ahead);
    if (job_.stop().max_steps() > 0 && clock > job_.stop().max_steps()) {
      clocks_.Release();
      return absl::FailedPreconditionError("the job ends before the next clock");
    }
    std::fill(worker_clocks.begin(), worker_clocks.end(), clock);
  } else {
    const std::vector<int64_t> active = clocks_.ActiveClocks();
    clock = active.empty() ? 0 : *std::min_element(active.begin(), active.end());
  }
  // Every worker completes a step within the heartbeat timeout unless something is wrong (then the failure
  // detector acts, and it must not wait behind this); the cut may be `ahead` steps away.
  absl::StatusOr<CheckpointInfo> taken = checkpointer_.Take(*map, clock, sync, worker_clocks,
                                                            ahead * (failure_detector_.timeout() + absl::Seconds(2)));
  if (sync && (!keep_hold || !taken.ok())) clocks_.Release();
  if (taken.ok()) {
    LOG(INFO) << "checkpoint " << taken->number << " at clock " << clock << " (" << why << ") in "
              << taken->folder << ", " << absl::FormatDuration(absl::Now() - start);
  }
  return taken;
}

int64_t JobCoordinator::StartClock(const Member& member) const {
  const std::vector<int64_t> clocks = clocks_.Clocks();
  const int64_t own = clocks[member.id];
  // A rank taken for the first time (in this scheduler's life) starts where the job has it: 0, or the
  // checkpoint's clock of a resumed job.
  if (member.state == MemberState::kVacant) return own;
  return rules_.ReturningStart(own, clocks_.ActiveClocks());
}

void JobCoordinator::Register(const tessera::v1::RegisterRequest& request,
                              std::function<void(absl::StatusOr<tessera::v1::RegisterResponse>)> done,
                              const std::string& member_key) {
  executor_.Submit([this, request, member_key, done = std::move(done)] {
    if (request.has_rejoin()) {
      TakeBack(request, member_key, done);
      return;
    }
    if (absl::Status afresh = take_back_.AdmitAfresh(); !afresh.ok()) {
      done(afresh);
      return;
    }
    if (request.role() == tessera::v1::WORKER && clocks_.stopped()) {
      done(absl::FailedPreconditionError(absl::StrCat("the job is stopping: ", clocks_.stop_reason())));
      return;
    }
    absl::StatusOr<ClusterView::Joined> joined =
        view_.Join(request, absl::Now(), [this](const Member& slot) { return StartClock(slot); },
                   /*suspect_after=*/2 * heartbeat_interval_);
    if (!joined.ok()) {
      done(joined.status());
      return;
    }
    // The parts that care heard of it already (OnMembership): a returning worker is in the servers' view.
    const Member& m = joined->member;
    if (m.role == tessera::v1::SERVER) servers_->SetControlKey(m.address, m.control_key);
    LOG(INFO) << m.Describe() << " registered (incarnation " << m.incarnation << ")"
              << (m.device.empty() ? "" : " on " + m.device)
              << (m.role == tessera::v1::WORKER && m.joined_clock > 0 ? absl::StrCat(", starting at clock ", m.joined_clock)
                                                                     : "");
    done(Registered(m));
    view_.Answered(m.role, m.id, m.incarnation, absl::Now());
  });
}

tessera::v1::RegisterResponse JobCoordinator::Registered(const Member& m) {
  tessera::v1::RegisterResponse response;
  response.set_id(m.id);
  *response.mutable_job() = job_;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  response.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(failure_detector_.timeout()));
  response.set_incarnation(m.incarnation);
  response.set_member_key(m.key);
  response.set_start_clock(m.joined_clock);
  if (m.role == tessera::v1::WORKER && balancer_.enabled()) {
    const BatchSlice slice = balancer_.SliceOf(m.id, m.joined_clock);
    response.set_batch_offset(slice.offset);
    response.set_batch_count(slice.count);
  }
  return response;
}

void JobCoordinator::TakeBack(const tessera::v1::RegisterRequest& request, const std::string& member_key,
                              std::function<void(absl::StatusOr<tessera::v1::RegisterResponse>)> done) {
  absl::StatusOr<Member> member = take_back_.Take(request, member_key);
  if (!member.ok()) {
    done(member.status());
    return;
  }
  const bool server = member->role == tessera::v1::SERVER;
  LOG(INFO) << member->Describe() << " came back (incarnation " << member->incarnation << ")"
            << (server ? "" : absl::StrCat(" at clock ", request.rejoin().clock()));
  tessera::v1::RegisterResponse response = Registered(*member);
  if (!server) response.set_start_clock(request.rejoin().clock());
  done(std::move(response));
  view_.Answered(member->role, member->id, member->incarnation, absl::Now());
}

absl::StatusOr<tessera::v1::HeartbeatResponse> JobCoordinator::Heartbeat(
    const tessera::v1::HeartbeatRequest& request) {
  TESSERA_RETURN_IF_ERROR(view_.Touch(request.role(), request.id(), request.incarnation(), absl::Now()));
  tessera::v1::HeartbeatResponse response;
  response.set_job_finished(finished());
  response.set_stopping(clocks_.stopped());
  response.set_epoch(view_.epoch());
  return response;
}

void JobCoordinator::Declare(const tessera::v1::DeclareRequest& request,
                             std::function<void(absl::StatusOr<tessera::v1::ShardMap>)> done) {
  executor_.Submit([this, request, done = std::move(done)] {
    absl::StatusOr<ClusterView::Placed> placed =
        view_.Place({request.params().begin(), request.params().end()}, job_.chunk_bytes());
    if (!placed.ok()) {
      done(placed.status());
      return;
    }
    std::optional<CheckpointInfo> resume;
    {
      absl::MutexLock lock(&mu_);
      resume = resume_;
    }
    if (resume) {
      // A resumed job: once every server is in, they restore their chunks from the checkpoint.
      if (!view_.AllServersAlive()) {
        done(absl::UnavailableError(view_.WaitingSummary(absl::Now(), failure_detector_.timeout())));
        return;
      }
      placed->map = *view_.Map();
      if (absl::Status s = servers_->Assign(placed->map, job_, resume->shard_files); !s.ok()) {
        done(Annotate(s, absl::StrCat("cannot restore the servers from ", resume->folder)));
        return;
      }
      LOG(INFO) << "cluster view epoch " << placed->map.epoch() << ": servers restored from " << resume->folder;
      absl::MutexLock lock(&mu_);
      resume_.reset();
    }
    if (placed->changed) {
      // The placement exists only once every server holds it: a failed hand-over leaves the job unplaced (a
      // lost server then waits for its replacement), and the worker's retry places again.
      absl::Status assigned = servers_->Assign(placed->map, job_);
      if (assigned.ok()) assigned = view_.Commit(*placed);
      if (!assigned.ok()) {
        // A job that has stopped hands over no view any more (CANCELLED): the declaration ends there, as a
        // retry would only make another view.
        const bool retry = assigned.code() != absl::StatusCode::kInvalidArgument &&
                           assigned.code() != absl::StatusCode::kResourceExhausted &&
                           assigned.code() != absl::StatusCode::kCancelled;
        LOG(WARNING) << "cluster view epoch " << placed->map.epoch() << " not placed: " << assigned;
        done(retry ? absl::UnavailableError(absl::StrCat("cannot hand shards to the servers yet (retrying): ",
                                                          assigned.message()))
                   : Annotate(assigned, "cannot hand shards to the servers"));
        return;
      }
      LOG(INFO) << "cluster view epoch " << placed->map.epoch() << ": " << placed->map.params_size()
                << " parameters in " << placed->map.chunks_size() << " chunks on " << placed->map.servers_size()
                << " servers";
    }
    done(placed->map);
  });
}

bool JobCoordinator::Resuming() const {
  absl::MutexLock lock(&mu_);
  return resume_.has_value();
}

absl::StatusOr<tessera::v1::ShardMap> JobCoordinator::GetShardMap() const {
  std::optional<tessera::v1::ShardMap> map = view_.Map();
  if (!map && take_back_.Pending()) {
    // A worker of the job asks before a restarted scheduler has the view back: it waits, as for its other calls.
    return absl::UnavailableError("no job yet: the scheduler waits for its members to register or come back; retry");
  }
  if (!map) return absl::FailedPreconditionError("no parameters have been declared yet");
  return *map;
}

void JobCoordinator::PublishView(const std::string& why) {
  std::optional<tessera::v1::ShardMap> map = view_.Map();
  if (!map) return;  // nothing placed: servers need no view yet
  if (absl::Status s = servers_->Assign(*map, job_); !s.ok()) {
    LOG(WARNING) << "cluster view epoch " << map->epoch() << " (" << why << ") did not reach every server: " << s;
    return;
  }
  LOG(INFO) << "cluster view epoch " << map->epoch() << ": " << why;
}

void JobCoordinator::AdvanceClock(const tessera::v1::AdvanceClockRequest& request,
                                  std::function<void(absl::StatusOr<tessera::v1::AdvanceClockResponse>)> done,
                                  std::function<bool()> cancelled) {
  const int worker = request.worker_id();
  const int64_t global_batch = int64_t{job_.batch_size()} * job_.cluster().num_workers();
  if (request.step_samples() < 0 || request.step_samples() > global_batch || !(request.step_busy_seconds() >= 0) ||
      request.step_busy_seconds() > absl::ToDoubleSeconds(kMaxWait)) {
    done(absl::InvalidArgumentError(absl::StrCat("worker ", worker, ": a step of ", request.step_samples(),
                                                 " examples in ", request.step_busy_seconds(),
                                                 " s is not one this job can take (at most ", global_batch,
                                                 " examples and an hour)")));
    return;
  }
  const std::vector<Member> workers = view_.Workers();
  if (worker >= 0 && worker < static_cast<int>(workers.size()) && workers[worker].state == MemberState::kLost) {
    done(absl::FailedPreconditionError(
        absl::StrCat(workers[worker].Describe(), " was declared lost; register again to rejoin")));
    return;
  }
  balancer_.Observe(worker, request.step_samples(), request.step_busy_seconds());
  records_.NoteClock(worker, request.clock());
  const absl::Duration wait = BoundedWait(request.wait_timeout_ms(), absl::Minutes(5));
  const int64_t clock = request.clock();
  clocks_.Advance(
      worker, clock, absl::Now() + wait,
      [this, worker, clock, done = std::move(done)](absl::StatusOr<GateResult> gate) {
        if (!gate.ok()) {
          done(gate.status());
          return;
        }
        done(GateAnswer(worker, clock, *gate));
      },
      std::move(cancelled));
}

tessera::v1::AdvanceClockResponse JobCoordinator::GateAnswer(int worker, int64_t clock, const GateResult& gate) {
  tessera::v1::AdvanceClockResponse response;
  response.set_min_clock(gate.min_clock);
  response.set_stop(gate.stop);
  response.set_stop_reason(gate.stop_reason);
  if (gate.rolled_back_to) {
    response.set_rolled_back(true);
    response.set_rollback_clock(*gate.rolled_back_to);
    response.set_rollback_generation(gate.rollback_generation);
  }
  if (gate.late_next_clock) {
    response.set_late(true);
    response.set_next_clock(*gate.late_next_clock);
  }
  const int64_t next = gate.rolled_back_to ? *gate.rolled_back_to : gate.late_next_clock ? *gate.late_next_clock : clock;
  const bool sync = job_.consistency().mode() == tessera::v1::ConsistencySpec::SYNC;
  std::set<int64_t> joining;
  int keeper = -1;
  for (const Member& m : view_.Workers()) {
    if (m.state != MemberState::kAlive) continue;
    if (sync && m.joined_clock > 0) joining.insert(m.joined_clock);
    // SYNC: one that holds the values of `next` before it starts that step (a joiner takes them first).
    if ((!sync || m.joined_clock < next) && (keeper < 0 || m.id < keeper)) keeper = m.id;
  }
  response.mutable_joining_clocks()->Add(joining.begin(), joining.end());
  response.set_values_keeper(std::max(keeper, 0));
  if (const int64_t cut = clocks_.HeldAt(); sync && cut == next + 1 && !gate.rolled_back_to) {
    response.set_checkpoint_clock(cut);
  }
  if (balancer_.enabled() && !gate.stop) {
    const BatchSlice slice = balancer_.SliceOf(worker, next);
    response.set_batch_offset(slice.offset);
    response.set_batch_count(slice.count);
  }
  return response;
}

void JobCoordinator::OnRoundDecided(const RoundMembers& round) {
  if (!round.late.empty()) VLOG(1) << "round " << round.round << " closed without " << round.late.size() << " late worker(s)";
  {
    absl::MutexLock lock(&mu_);
    if (rounds_queued_) return;  // the queued send will carry this round too
    rounds_queued_ = true;
  }
  round_sender_.Submit([this] {
    {
      absl::MutexLock lock(&mu_);
      rounds_queued_ = false;
    }
    // The newest few decisions: a server that missed one call (or joined since) still learns every round it
    // may be collecting.
    constexpr size_t kResent = 8;
    const std::vector<RoundMembers> rounds = clocks_.RecentRounds();
    tessera::v1::DecideRoundsRequest request;
    for (size_t i = rounds.size() > kResent ? rounds.size() - kResent : 0; i < rounds.size(); ++i) {
      auto* r = request.add_rounds();
      r->set_round(rounds[i].round);
      r->mutable_workers()->Add(rounds[i].members.begin(), rounds[i].members.end());
    }
    std::optional<tessera::v1::ShardMap> map = view_.Map();
    if (!map) return;
    if (absl::Status s = servers_->DecideRounds(*map, request); !s.ok()) LOG(WARNING) << s;
  });
}

absl::StatusOr<tessera::v1::ReportResponse> JobCoordinator::Report(const tessera::v1::ReportRequest& request) {
  if (request.worker_id() < 0 || request.worker_id() >= job_.cluster().num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("report from unknown worker ", request.worker_id()));
  }
  TESSERA_RETURN_IF_ERROR(CheckLength("report: device", request.device(), kMaxNameBytes));
  if (request.clock() < 0 || request.clock() > kMaxClock || request.eval_clock() < 0 ||
      request.eval_clock() > kMaxClock || !(request.epoch() >= 0) || !std::isfinite(request.epoch()) ||
      request.samples() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("report from worker ", request.worker_id(), ": clock ",
                                                   request.clock(), ", eval clock ", request.eval_clock(), ", epoch ",
                                                   request.epoch(), " or samples ", request.samples(),
                                                   " out of range"));
  }
  if (request.has_eval() && (!(request.test_accuracy() >= 0 && request.test_accuracy() <= 1) ||
                             std::isinf(request.test_loss()) || request.test_loss() < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("report from worker ", request.worker_id(), ": test accuracy ",
                                                   request.test_accuracy(), " is not in [0, 1] or test loss ",
                                                   request.test_loss(), " is negative or infinite"));
  }
  if (!request.device().empty()) view_.SetWorkerDevice(request.worker_id(), request.device());
  const ProgressRecords::Taken taken = records_.AddReport(request);
  if (!taken.reached.empty()) end_.StopCompleted(taken.reached);
  if (taken.evaluation) {
    executor_.Submit([this, request] {
      if (std::optional<tessera::v1::ShardMap> map = view_.Map()) records_.UpdateServerStats(servers_->Stats(*map));
      records_.WriteEvalRecord(request);
    });
  }
  return StopResponse();
}

tessera::v1::ReportResponse JobCoordinator::StopResponse() const {
  tessera::v1::ReportResponse response;
  response.set_stop(clocks_.stopped());
  if (response.stop()) response.set_stop_reason(clocks_.stop_reason());
  return response;
}

absl::Status JobCoordinator::ReportServer(const tessera::v1::ReportServerRequest& request) {
  if (request.server_id() < 0 || request.server_id() >= job_.cluster().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("report of server ", request.server_id(), "; the job has ",
                                                   job_.cluster().num_servers()));
  }
  TESSERA_RETURN_IF_ERROR(CheckLength("report: error", request.error(), kMaxErrorBytes));
  if (clocks_.stopped()) {
    // Nothing moves once the job is stopping: a server its workers cannot reach then (its job over, it may be
    // leaving) is not declared lost, and a job that completed stays so.
    VLOG(1) << "server " << request.server_id() << " reported unreachable after the job's stop: " << request.error();
    return absl::OkStatus();
  }
  const Member server = view_.Servers()[request.server_id()];
  if (server.state != MemberState::kAlive ||
      (request.incarnation() != 0 && request.incarnation() != server.incarnation)) {
    return absl::OkStatus();  // lost or replaced already
  }
  {
    absl::MutexLock lock(&mu_);
    if (!probing_.insert(server.id).second) return absl::OkStatus();  // a probe is on its way
  }
  const std::string reporter = absl::StrCat(request.role() == tessera::v1::SERVER ? "server " : "worker ",
                                            request.member_id());
  prober_.Submit([this, server, reporter, error = request.error()] {
    const absl::Status answer = servers_->Probe(server.address, kServerProbeTimeout);
    {
      absl::MutexLock lock(&mu_);
      probing_.erase(server.id);
    }
    if (!absl::IsUnavailable(answer) && !absl::IsDeadlineExceeded(answer)) {
      LOG(INFO) << reporter << " could not reach " << server.Describe() << " (" << error
                << "), but it answers the scheduler";
      return;
    }
    view_.MarkServerLost(server.id, server.incarnation,
                         absl::StrCat(reporter, " could not reach it (", error,
                                      "), nor could the scheduler (", answer.message(), ")"));
  });
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobCoordinator::Drain(int server) {
  if (server < 0 || server >= job_.cluster().num_servers()) {
    return absl::InvalidArgumentError(absl::StrCat("no server ", server, " in the job (0 to ",
                                                   job_.cluster().num_servers() - 1, ")"));
  }
  // On the executor, like every move of chunks, one at a time.
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::StatusOr<std::string>>(absl::UnknownError("not run"));
  executor_.Submit([this, server, done, result] {
    *result = moves_.Drain(server);
    done->Notify();
  });
  done->WaitForNotification();
  return *result;
}

void JobCoordinator::OnMembership(const MembershipEvent& event) {
  const Member& m = event.member;
  switch (event.kind) {
    case MembershipEvent::kWorkerJoined:
      // The servers learn its key (and so take its pushes) before it hears back. (A resumed job's servers get
      // the view, keys included, with their restore.)
      if (view_.placed() && !Resuming()) PublishView(absl::StrCat("worker ", m.id, " joined"));
      break;
    case MembershipEvent::kWorkerRejoined:
      // The clock table holds it one clock below its start until the servers know it (so that no sync round it
      // belongs to closes without it); then it goes on from its start.
      PublishView(absl::StrCat("worker ", m.id, " rejoined at clock ", m.joined_clock));
      clocks_.Rejoin(m.id, m.joined_clock);
      break;
    case MembershipEvent::kWorkerLost:
      WorkerLost(m, event.failure);
      break;
    case MembershipEvent::kWorkerDone:
      end_.MaybeFinish();
      break;
    default:
      break;
  }
}

void JobCoordinator::WorkerLost(const Member& m, const std::string& failure) {
  end_.NoteWorkerLost(m, failure);
  executor_.Submit([this, why = absl::StrCat("worker ", m.id, " left")] { PublishView(why); });
  end_.MaybeFinish();
}

absl::Status JobCoordinator::Done(const tessera::v1::DoneRequest& request) { return end_.WorkerDone(request); }
void JobCoordinator::Abort(const std::string& reason) { end_.Abort(reason); }
void JobCoordinator::FinishNow() { end_.FinishNow(); }
nlohmann::json JobCoordinator::summary() const { return end_.summary(); }
bool JobCoordinator::finished() const { return end_.finished(); }

nlohmann::json JobCoordinator::StatusJson() const {
  // The summary once written: /status agrees with the printed line from then on.
  const bool finished = end_.finished();
  const nlohmann::json summary = end_.summary();
  return pages_.StatusJson(finished ? &summary : nullptr);
}

std::string JobCoordinator::MetricsText() const { return pages_.MetricsText(finished()); }

}  // namespace tessera

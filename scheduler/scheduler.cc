#include "scheduler/scheduler.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "common/rpc/rpc.h"
#include "common/base/status_macros.h"
#include "scheduler/dashboard_page.h"
#include "glog/logging.h"

namespace tessera {

namespace {
// Writes the scheduler's address to `path` (through a temporary file renamed into place: a reader never sees half
// of it).
absl::Status WriteAddressFile(const std::string& path, const std::string& address) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Start(const SchedulerOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateSchedulerOptions(options));
  std::unique_ptr<Scheduler> scheduler(new Scheduler(options));
  Scheduler* self = scheduler.get();
  scheduler->server_control_ = std::make_unique<GrpcServerControl>(options.security);
  TESSERA_ASSIGN_OR_RETURN(
      scheduler->coordinator_,
      JobCoordinator::Create(options.job, options.run_dir, absl::Milliseconds(options.heartbeat_interval_ms),
                             absl::Milliseconds(options.heartbeat_timeout_ms), scheduler->server_control_.get(),
                             [self](const JobOutcome& outcome) {
                               self->JobEnded(outcome.completed ? absl::OkStatus()
                                                            : absl::AbortedError(absl::StrCat(
                                                                  "the job did not complete: ", outcome.stop_reason)));
                             },
                             options.resume_dir, options.interrupted_run));
  scheduler->service_ = std::make_unique<SchedulerService>(scheduler->coordinator_.get(), options.security);
  TESSERA_ASSIGN_OR_RETURN(StartedServer started, StartGrpcServer(options.listen_host, options.port,
                                                                  {scheduler->service_.get()}, *options.security));
  scheduler->grpc_ = std::move(started);
  scheduler->address_ = JoinHostPort(options.listen_host, scheduler->grpc_.port);
  if (!options.address_file.empty()) TESSERA_RETURN_IF_ERROR(WriteAddressFile(options.address_file, scheduler->address_));
  if (options.http_port >= 0) TESSERA_RETURN_IF_ERROR(scheduler->StartHttp());
  scheduler->coordinator_->StartFailureDetection();
  const auto& job = options.job;
  LOG(INFO) << "scheduler at " << scheduler->address_ << ": job '" << job.name() << "', "
            << ModeName(job.consistency()) << ", " << job.cluster().num_servers() << " servers, "
            << job.cluster().num_workers() << " workers";
  return scheduler;
}

absl::Status Scheduler::StartHttp() {
  const SchedulerOptions& options = options_;
  const JobCoordinator* coordinator = coordinator_.get();
  TESSERA_ASSIGN_OR_RETURN(
      http_,
      HttpEndpoint::Start(options.listen_host, options.http_port, *options.security,
                          {{"/", {"text/html; charset=utf-8", [] { return std::string(kDashboardPage); }}},
                           {"/metrics", {"text/plain; version=0.0.4", [coordinator] { return coordinator->MetricsText(); }}},
                           {"/status", {"application/json", [coordinator] { return coordinator->StatusJson().dump(2); }}},
                           {"/drain", {"text/plain", nullptr, /*post=*/true,
                                       [this](const std::map<std::string, std::string>& query)
                                           -> absl::StatusOr<std::string> {
                                         auto it = query.find("server");
                                         int server = -1;
                                         if (it == query.end() || !absl::SimpleAtoi(it->second, &server)) {
                                           return absl::InvalidArgumentError(
                                               "POST /drain?server=N: name the server id to drain");
                                         }
                                         return coordinator_->Drain(server);
                                       }}},
                           {"/checkpoint", {"text/plain", nullptr, /*post=*/true,
                                            [this](const std::map<std::string, std::string>&)
                                                -> absl::StatusOr<std::string> {
                              absl::StatusOr<CheckpointInfo> taken = coordinator_->Checkpoint("asked over HTTP");
                              if (!taken.ok()) return Annotate(taken.status(), "no checkpoint");
                              return absl::StrCat("checkpoint ", taken->number, " at clock ", taken->state.clock(),
                                                  " in ", taken->folder, "\n");
                            }}}}));
  dashboard_url_ = absl::StrCat(options.security->tls() ? "https" : "http", "://",
                                JoinHostPort(options.listen_host, http_->port()), "/");
  LOG(INFO) << "dashboard at " << dashboard_url_ << " (JSON at /status; POST /checkpoint takes a checkpoint; "
            << "POST /drain?server=N moves server N's chunks away and lets it exit)";
  return absl::OkStatus();
}

Scheduler::~Scheduler() {
  http_.reset();
  if (coordinator_) coordinator_->Abort("scheduler shutting down");
  grpc_.Shutdown(absl::Seconds(1));
  coordinator_.reset();  // drains its executor while the server pool is still alive
}

absl::Status Scheduler::Wait() {
  absl::Status reason;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::optional<absl::Status>* r) { return r->has_value(); }, &stop_reason_));
    reason = *stop_reason_;
  }
  bool stop_asked = false;
  {
    absl::MutexLock lock(&mu_);
    stop_asked = stop_asked_;
  }
  if (!reason.ok() && !coordinator_->finished()) EndJobEarly(reason);
  // Whoever called Stop() wants the scheduler gone; a job that ended by itself leaves its page up.
  if (!stop_asked && options_.linger_s > 0 && http_ != nullptr) {
    LOG(INFO) << "the job has ended; /status, the dashboard and /metrics stay up for " << options_.linger_s
              << " s (--linger_s; a signal ends this)";
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&interrupted_), absl::Seconds(options_.linger_s));
  }
  // Let in-flight calls (workers' last Done, servers' last heartbeat) finish, then close.
  grpc_.Shutdown(absl::Seconds(2));
  return reason;
}

void Scheduler::EndJobEarly(const absl::Status& reason) {
  const std::string why(reason.message());
  if (!options_.job.checkpoint().dir().empty()) {
    absl::StatusOr<CheckpointInfo> taken = coordinator_->Checkpoint(absl::StrCat("before stopping: ", why));
    if (taken.ok()) {
      LOG(INFO) << "checkpoint " << taken->number << " at clock " << taken->state.clock() << " in " << taken->folder;
    } else {
      LOG(WARNING) << "no checkpoint before stopping: " << taken.status();
    }
  }
  coordinator_->Abort(why);
  // With no worker running (none joined, or every one left), nobody has a step to finish: the job ends now.
  bool any_running = false;
  for (const Member& w : coordinator_->view().Workers()) any_running |= w.state == MemberState::kAlive;
  if (!any_running) {
    LOG(INFO) << why << ": no worker is running";
  } else {
    LOG(INFO) << why << ": the workers stop after their step (up to " << options_.stop_grace_ms << " ms)";
  }
  if (any_running && !AwaitFinishedOrInterrupted(absl::Milliseconds(options_.stop_grace_ms))) {
    LOG(WARNING) << "ending the job without the workers that have not reported";
  }
  coordinator_->FinishNow();
}

bool Scheduler::AwaitFinishedOrInterrupted(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &Scheduler::JobEndedOrInterrupted), timeout);
  return job_ended_;
}

bool Scheduler::WaitForStop(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(+[](std::optional<absl::Status>* r) { return r->has_value(); }, &stop_reason_), timeout);
}

void Scheduler::JobEnded(absl::Status outcome) {
  absl::MutexLock lock(&mu_);
  job_ended_ = true;
  if (!stop_reason_) stop_reason_ = std::move(outcome);
}

void Scheduler::Stop(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  stop_asked_ = true;
  if (!stop_reason_) {
    stop_reason_ = std::move(reason);
  } else {
    interrupted_ = true;
  }
}

}  // namespace tessera

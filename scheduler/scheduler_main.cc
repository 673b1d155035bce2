// tessera-scheduler: reads a job file, hands the job to the servers and workers that register, places shards,
// gates clocks, records progress, and exits when the job is over.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/daemon/daemon_init.h"
#include "common/daemon/run_recorder.h"
#include "common/rpc/security_flags.h"
#include "common/daemon/signals.h"
#include "common/base/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "scheduler/scheduler.h"

DEFINE_string(job, "", "JobSpec file, protobuf text format or JSON (required); examples in deploy/jobs/");
DEFINE_string(host, "127.0.0.1", "address to listen on (loopback by default; 0.0.0.0 for every interface)");
DEFINE_int32(port, 0, "port to listen on; 0 picks a free one (see --address_file)");
DEFINE_string(address_file, "", "write HOST:PORT here once listening");
DEFINE_string(run_dir, "", "directory for metrics.jsonl and summary.json; empty: print only");
DEFINE_bool(overwrite, false,
            "start afresh in a --run_dir that holds a finished run, whose records move to RUN_DIR/replaced-<time>/ "
            "(refused otherwise, unless --resume). A run that never ended is taken back from its members instead "
            "(a restarted scheduler); when none comes back within --heartbeat_timeout_ms, its records move aside "
            "and the job starts afresh");
DEFINE_int32(num_servers, 0, "override the job's cluster.num_servers (0: keep)");
DEFINE_int32(num_workers, 0, "override the job's cluster.num_workers (0: keep)");
DEFINE_int32(http_port, 0, "port of /healthz, /metrics and /status on --host; 0 picks a free one (logged), -1: off");
DEFINE_int32(heartbeat_timeout_ms, 10000,
             "a server or worker silent this long is lost (the other workers go on; a lost server stops the job)");
DEFINE_int32(heartbeat_interval_ms, 500, "how often servers and workers heartbeat");
DEFINE_int32(linger_s, 0,
             "after the job ends, keep serving /status, the dashboard and /metrics this many seconds (0: exit at "
             "once); a signal ends the wait");
DEFINE_int32(stop_grace_ms, 10000,
             "on SIGTERM or SIGINT: how long the workers get to finish their step and report before the job ends "
             "without them (a checkpoint is taken first when the job takes them)");
DEFINE_string(checkpoint_dir, "",
              "folder for checkpoints, reachable by every server too (overrides the job's checkpoint.dir)");
DEFINE_string(resume, "",
              "go on with the job from the newest usable checkpoint in this folder (a job's checkpoint.dir)");
TESSERA_DEFINE_SECURITY_FLAGS()

namespace {
// The scheduler's options from its flags and the job file, validated.
absl::StatusOr<tessera::SchedulerOptions> OptionsFromFlags() {
  auto job = tessera::LoadSchedulerJob(FLAGS_job, FLAGS_num_servers, FLAGS_num_workers,
                                       FLAGS_checkpoint_dir.empty() ? FLAGS_resume : FLAGS_checkpoint_dir);
  if (!job.ok()) return job.status();
  tessera::SchedulerOptions options;
  options.job = *job;
  options.listen_host = FLAGS_host;
  options.port = FLAGS_port;
  options.address_file = FLAGS_address_file;
  options.run_dir = FLAGS_run_dir;
  options.heartbeat_interval_ms = FLAGS_heartbeat_interval_ms;
  options.heartbeat_timeout_ms = FLAGS_heartbeat_timeout_ms;
  options.http_port = FLAGS_http_port;
  options.resume_dir = FLAGS_resume;
  options.linger_s = FLAGS_linger_s;
  options.stop_grace_ms = FLAGS_stop_grace_ms;
  auto security = tessera::Security::Load(SecurityFlags());
  if (!security.ok()) return security.status();
  options.security = *security;
  TESSERA_RETURN_IF_ERROR(tessera::ValidateSchedulerOptions(options));
  return options;
}
}  // namespace

int main(int argc, char** argv) {
  tessera::InitDaemon("tessera-scheduler --job=FILE [--port=N --run_dir=DIR]", &argc, &argv);

  absl::StatusOr<tessera::SchedulerOptions> from_flags = OptionsFromFlags();
  if (!from_flags.ok()) {
    std::cerr << "tessera-scheduler: " << from_flags.status().message() << std::endl;
    return 2;
  }
  tessera::SchedulerOptions& options = *from_flags;
  // A resumed job adds to its run's records, and so does a scheduler restarted on a run that never ended (a
  // service manager restarting it): it takes the job back from the members still running it.
  options.interrupted_run = FLAGS_resume.empty() && tessera::UnfinishedRun(FLAGS_run_dir);
  if (options.interrupted_run) {
    std::cout << "the run in " << FLAGS_run_dir << " never ended: taking its job back from the members that come "
              << "back (when none does within --heartbeat_timeout_ms, the job starts afresh and the earlier "
              << "records move aside)" << std::endl;
  }
  if (absl::Status s = FLAGS_resume.empty() && !options.interrupted_run
                           ? tessera::ClaimRunDirectory(FLAGS_run_dir, FLAGS_overwrite)
                           : absl::OkStatus();
      !s.ok()) {
    std::cerr << "tessera-scheduler: " << s.message() << std::endl;
    return 2;
  }

  auto scheduler = tessera::Scheduler::Start(options);
  // A job, checkpoint or flag to fix exits 2, as for bad flags (a service manager does not restart it); a
  // failure that may pass (a port in use, ...) exits 1.
  if (!scheduler.ok()) return tessera::StartFailed("tessera-scheduler", scheduler.status());
  std::cout << "scheduler listening on " << (*scheduler)->address() << std::endl;
  if (!(*scheduler)->dashboard_url().empty()) std::cout << "dashboard at " << (*scheduler)->dashboard_url() << std::endl;
  tessera::Scheduler* daemon = scheduler->get();
  tessera::DaemonRun run;
  run.stop = [daemon](int signal) {
    daemon->Stop(absl::CancelledError(absl::StrCat("stopped by ", tessera::SignalName(signal))));
  };
  run.wait = [daemon] { return daemon->Wait(); };
  // A job that ended without completing (ABORTED) exits 3.
  run.failure_exit = [](const absl::Status& status) { return status.code() == absl::StatusCode::kAborted ? 3 : 1; };
  return tessera::RunUntilStopped("tessera-scheduler", run);
}

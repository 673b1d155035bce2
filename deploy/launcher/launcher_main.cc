// tessera-launch: a whole local cluster (1 scheduler, N servers, M workers, each its own process) for one job.
// With no --job it runs the embedded default: an MLP on Fashion-MNIST, 2 servers, 2 workers, sync.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/daemon/command_line.h"
#include "common/daemon/daemon_init.h"
#include "common/daemon/run_recorder.h"
#include "common/daemon/signals.h"
#include "common/rpc/security_flags.h"
#include "common/model/job_spec.h"
#include "common/base/status_macros.h"
#include "deploy/default_job.h"
#include "deploy/launcher/launcher.h"
#include "absl/synchronization/mutex.h"
#include "gflags/gflags.h"

DEFINE_string(job, "", "JobSpec file (text format or JSON); default: the embedded Fashion-MNIST MLP sync job");
DEFINE_string(job_override, "",
              "job fields in text format merged over the job, e.g. 'cluster { num_workers: 4 } optimizer { "
              "momentum: 0.5 }' (a repeated field named here replaces the job's list)");
DEFINE_int32(servers, 0, "number of servers (0: the job's cluster.num_servers)");
DEFINE_int32(workers, 0, "number of workers (0: the job's cluster.num_workers)");
DEFINE_string(run_dir, "", "run directory (logs/, metrics.jsonl, summary.json); default: runs/<job>-<time>");
DEFINE_string(device, "auto", "worker device: auto, cpu or cuda:N");
DEFINE_string(worker_devices, "", "comma-separated device per worker, e.g. cuda:0,cpu (a mixed-device job); "
              "overrides --device");
DEFINE_string(worker_cpu_quota, "",
              "experiments: each worker's CPU quota in CPUs, comma-separated and repeated over the ranks (1,0.25: "
              "even ranks one CPU, odd ranks a quarter of one; 0 or none: no quota): a worker truly slower, as on a "
              "slower device, in a control group of its own (cgroup v2 cpu.max or v1 cpu.cfs_quota_us; needs a "
              "writable CPU controller, e.g. root)");
DEFINE_string(worker_cpu_quota_at, "",
              "experiments: change the quotas of --worker_cpu_quota during the run: SECONDS:QUOTAS after the workers "
              "started, several separated by ; (e.g. '20:1,1,1,0.25' slows worker 3 at 20 s, as a throttled device)");
DEFINE_int32(slow_worker, -1,
             "experiments: the worker (rank) made a straggler by --inject_slowdown_ms and/or --slow_factor (it "
             "sleeps: a fixed delay per step, which hands its CPU to the others; --worker_cpu_quota makes a worker "
             "truly slower)");
DEFINE_int32(inject_slowdown_ms, 0, "experiments: extra milliseconds per step on --slow_worker");
DEFINE_double(slow_factor, 1.0, "experiments: --slow_worker computes this many times slower (a slower device)");
DEFINE_int64(slow_from_step, 0, "experiments: --slow_worker's slowdown starts at this clock");
DEFINE_double(stall_probability, 0,
              "experiments: every worker's steps stall with this probability for --stall_ms (transient stragglers)");
DEFINE_int32(stall_ms, 0, "experiments: how long a transient stall lasts");
DEFINE_uint64(stall_seed, 1, "experiments: seed of the stalls (the same seed stalls the same steps)");
DEFINE_int32(simulate_compute_ms, 0,
             "benchmarks: every worker replaces forward and backward by waiting this many milliseconds per step");
DEFINE_string(dump_params, "", "worker rank 0 writes the final parameters to this file");
DEFINE_int32(timeout_s, 0, "stop the whole cluster after this many seconds; 0: no limit");
DEFINE_int32(linger_s, 60,
             "after the job ends, the dashboard, /status and /metrics stay up this many seconds (Ctrl-C ends the "
             "wait; 0: exit at once)");
DEFINE_bool(overwrite, false,
            "start afresh in a --run_dir that holds an earlier run; its logs, records and checkpoints move to "
            "RUN_DIR/replaced-<time>/");
DEFINE_int64(checkpoint_every_steps, 0, "checkpoint every this many clocks (sets the job's checkpoint.every_steps)");
DEFINE_int32(checkpoint_every_s, 0, "checkpoint every this many seconds (sets the job's checkpoint.every_seconds)");
DEFINE_string(checkpoint_dir, "",
              "where checkpoints go (sets the job's checkpoint.dir); default with a cadence: RUN_DIR/checkpoints");
DEFINE_string(resume, "",
              "RUN_DIR of an earlier run of tessera-launch: go on with its job (RUN_DIR/job.pbtxt) from its newest "
              "usable checkpoint, in the same run directory");
DEFINE_double(server_row_memory_mb, 0,
              "each server's --max_row_memory_mb: the memory its rows of embedding tables may take, in MiB (fractions "
              "allowed); 0: no cap");
DEFINE_int32(heartbeat_timeout_ms, 0,
             "a daemon silent this long is lost (the scheduler's --heartbeat_timeout_ms); 0: its default, 10 s");
DEFINE_int32(restart_servers, 0,
             "start a server that failed again (same id; it takes a share of the chunks, restored from a "
             "checkpoint), at most this many times per server; 0: the job goes on without it when it can");
DEFINE_int32(restart_workers, 0,
             "start a worker that failed again (same rank, a new incarnation that rejoins the running job), at "
             "most this many times per worker; 0: the job goes on without it (one that never joined ends the run). "
             "With restarts, an error a worker's own program raised no longer fails the job (the job's "
             "cluster.worker_errors becomes AWAIT_RESTART)");
DEFINE_int32(restart_scheduler, 0,
             "start the scheduler again when it dies (killed, or exit 1), on the same port, at most this many "
             "times: it takes the running job back from the servers and workers, which wait for it up to the "
             "heartbeat timeout; 0: the job ends with it");
DEFINE_bool(tls, false,
            "make a fresh CA and certificate for the run (in RUN_DIR/secrets, with the run's token) and have every "
            "daemon use mutual TLS; --tls_cert/--tls_key/--tls_ca give your own instead");
TESSERA_DEFINE_SECURITY_FLAGS()

namespace {

// A mistake in how the launcher was called: the message is printed after "tessera-launch: ", and it exits 2.
absl::Status UsageError(absl::string_view message) { return absl::InvalidArgumentError(message); }

// Everything after "--" is the workers' command (in the manner of torchrun), not the launcher's arguments: it is
// taken off `argc`.
absl::StatusOr<std::vector<std::string>> TakeWorkerCommand(int& argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    std::vector<std::string> command(argv + i + 1, argv + argc);
    argc = i;
    if (command.empty()) {
      return UsageError("nothing after \"--\": give the workers' command there, e.g. -- python3 train.py");
    }
    return command;
  }
  return std::vector<std::string>();
}

void CheckLauncherFlags() {
  tessera::CheckFlags({tessera::NonNegativeFlag("servers"), tessera::NonNegativeFlag("workers"),
                       tessera::NonNegativeFlag("timeout_s"), tessera::NonNegativeFlag("linger_s"),
                       tessera::AtLeastFlag("slow_worker", -1, "must be a worker rank, or -1 (none)"),
                       tessera::NonNegativeFlag("inject_slowdown_ms"), tessera::NonNegativeFlag("stall_ms"),
                       tessera::NonNegativeFlag("simulate_compute_ms"), tessera::NonNegativeFlag("checkpoint_every_steps"),
                       tessera::NonNegativeFlag("checkpoint_every_s"), tessera::NonNegativeFlag("heartbeat_timeout_ms"),
                       tessera::NonNegativeFlag("restart_servers"), tessera::NonNegativeFlag("restart_workers"),
                       tessera::NonNegativeFlag("restart_scheduler"), tessera::NonNegativeFlag("server_row_memory_mb")});
}

// The job: the embedded default, --job's file or that of the run --resume continues; --job_override merged over
// it, the defaults applied and the flags that set its fields.
absl::StatusOr<tessera::v1::JobSpec> LoadJob(std::string& origin) {
  std::string job_text = tessera::kDefaultJobText;
  origin = "the embedded default job";
  const std::string job_file = FLAGS_resume.empty() ? FLAGS_job : FLAGS_resume + "/job.pbtxt";
  if (!FLAGS_resume.empty() && !FLAGS_job.empty()) {
    return UsageError("--resume continues the job of that run; --job cannot be given with it");
  }
  if (!job_file.empty()) {
    std::ifstream in(job_file);
    if (!in) return UsageError(absl::StrCat("cannot read job file ", job_file));
    job_text.assign(std::istreambuf_iterator<char>(in), {});
    origin = job_file;
  }
  absl::StatusOr<tessera::v1::JobSpec> job = tessera::ParseJobSpec(job_text, origin);
  if (!job.ok()) return UsageError(absl::StrCat(origin, ": ", job.status().message()));
  if (!FLAGS_job_override.empty()) {
    if (absl::Status merged = tessera::MergeJobOverrides(FLAGS_job_override, *job); !merged.ok()) {
      return UsageError(absl::StrCat("--job_override: ", merged.message()));
    }
  }
  tessera::ApplyJobDefaults(*job);
  if (FLAGS_servers > 0) job->mutable_cluster()->set_num_servers(FLAGS_servers);
  if (FLAGS_workers > 0) job->mutable_cluster()->set_num_workers(FLAGS_workers);
  if (FLAGS_checkpoint_every_steps > 0) job->mutable_checkpoint()->set_every_steps(FLAGS_checkpoint_every_steps);
  if (FLAGS_checkpoint_every_s > 0) job->mutable_checkpoint()->set_every_seconds(FLAGS_checkpoint_every_s);
  if (!FLAGS_checkpoint_dir.empty()) job->mutable_checkpoint()->set_dir(FLAGS_checkpoint_dir);
  // A worker that will be started again is awaited, whatever stopped it.
  if (FLAGS_restart_workers > 0) job->mutable_cluster()->set_worker_errors(tessera::v1::ClusterSpec::AWAIT_RESTART);
  return job;
}

// Where the run goes and how its cluster starts; checkpoints default into the run directory, and the job is
// validated as it will run.
absl::StatusOr<tessera::LaunchOptions> RunOptions(tessera::v1::JobSpec& job, const std::string& origin) {
  tessera::LaunchOptions options;
  std::error_code error;
  options.bin_dir = std::filesystem::read_symlink("/proc/self/exe", error).parent_path().string();
  options.run_dir = !FLAGS_resume.empty() ? FLAGS_resume
                    : FLAGS_run_dir.empty()
                        ? absl::StrCat("runs/", job.name().empty() ? "job" : job.name(), "-",
                                       absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()))
                        : FLAGS_run_dir;
  if (job.checkpoint().dir().empty() && (job.checkpoint().every_steps() > 0 || job.checkpoint().every_seconds() > 0)) {
    job.mutable_checkpoint()->set_dir(options.run_dir + "/checkpoints");
  }
  if (absl::Status valid = tessera::ValidateJobSpec(job); !valid.ok()) {
    return UsageError(absl::StrCat(origin, ": ", valid.message()));
  }
  if (!FLAGS_resume.empty()) {
    if (job.checkpoint().dir().empty()) {
      return UsageError(absl::StrCat("the job of ", FLAGS_resume, " took no checkpoints; nothing to resume"));
    }
    options.resume_dir = job.checkpoint().dir();
  }
  options.servers = job.cluster().num_servers();
  options.workers = job.cluster().num_workers();
  options.device = FLAGS_device;
  if (!FLAGS_worker_devices.empty()) {
    options.worker_devices = absl::StrSplit(FLAGS_worker_devices, ',', absl::SkipEmpty());
  }
  options.simulate_compute_ms = FLAGS_simulate_compute_ms;
  options.dump_params = FLAGS_dump_params;
  options.timeout_s = FLAGS_timeout_s;
  options.linger_s = FLAGS_linger_s;
  options.tls = FLAGS_tls;
  // Given credentials are used as they are; otherwise the launcher makes a fresh token (and with --tls, a CA).
  const tessera::SecurityOptions given = SecurityFlags();
  if (!given.token_file.empty() || !given.tls_cert.empty()) {
    if (given.token_file.empty()) return UsageError("with your own --tls_cert, give the job's --token_file too");
    options.security = given;
  }
  options.restart_workers = FLAGS_restart_workers;
  options.restart_servers = FLAGS_restart_servers;
  options.restart_scheduler = FLAGS_restart_scheduler;
  options.heartbeat_timeout_ms = FLAGS_heartbeat_timeout_ms;
  options.server_row_memory_mb = FLAGS_server_row_memory_mb;
  return options;
}

// The experiments' unequal workers: CPU quotas (and their changes during the run), stragglers and stalls.
absl::Status SetUnequalWorkers(tessera::LaunchOptions& options) {
  if (!FLAGS_worker_cpu_quota_at.empty() && FLAGS_worker_cpu_quota.empty()) {
    return UsageError("--worker_cpu_quota_at changes the quotas of --worker_cpu_quota; give that too (0 for no "
                      "quota at the start)");
  }
  if (!FLAGS_worker_cpu_quota.empty()) {
    absl::StatusOr<std::vector<double>> quotas = tessera::ParseCpuQuotas(FLAGS_worker_cpu_quota);
    if (!quotas.ok()) return UsageError(quotas.status().message());
    absl::StatusOr<std::vector<tessera::CpuQuotaChange>> changes =
        tessera::ParseCpuQuotaChanges(FLAGS_worker_cpu_quota_at);
    if (!changes.ok()) return UsageError(changes.status().message());
    options.worker_cpu_quota = *quotas;
    options.worker_cpu_quota_changes = *changes;
  }
  options.slow_worker = FLAGS_slow_worker;
  options.slow.delay_ms = FLAGS_inject_slowdown_ms;
  options.slow.slow_factor = FLAGS_slow_factor;
  options.slow.from_step = FLAGS_slow_from_step;
  options.stalls.stall_probability = FLAGS_stall_probability;
  options.stalls.stall_ms = FLAGS_stall_ms;
  options.stalls.stall_seed = FLAGS_stall_seed;
  for (const tessera::StragglerOptions* s : {&options.slow, &options.stalls}) {
    if (absl::Status valid = s->Validate(); !valid.ok()) return UsageError(valid.message());
  }
  return absl::OkStatus();
}

// One run per run directory (a resumed run goes on in its own), which keeps the exact job that ran.
absl::Status PrepareRunDirectory(tessera::LaunchOptions& options, const tessera::v1::JobSpec& job) {
  if (FLAGS_resume.empty()) {
    if (absl::Status s = tessera::ClaimRunDirectory(options.run_dir, FLAGS_overwrite,
                                                    {"job.pbtxt", "logs", "secrets", "checkpoints", "cpu_quotas.jsonl"});
        !s.ok()) {
      return UsageError(s.message());
    }
  }
  std::error_code error;
  std::filesystem::create_directories(options.run_dir, error);
  options.job_path = options.run_dir + "/job.pbtxt";
  std::ofstream out(options.job_path);
  out << tessera::JobSpecToText(job);
  if (!out) return UsageError(absl::StrCat("cannot write ", options.job_path));
  return absl::OkStatus();
}

// The options of this run, from the flags and the workers' command; a usage error otherwise.
absl::StatusOr<tessera::LaunchOptions> Prepare(std::vector<std::string> worker_command) {
  std::string origin;
  TESSERA_ASSIGN_OR_RETURN(tessera::v1::JobSpec job, LoadJob(origin));
  TESSERA_ASSIGN_OR_RETURN(tessera::LaunchOptions options, RunOptions(job, origin));
  TESSERA_RETURN_IF_ERROR(SetUnequalWorkers(options));
  options.worker_command = std::move(worker_command);
  TESSERA_RETURN_IF_ERROR(PrepareRunDirectory(options, job));
  std::cout << "tessera-launch: job '" << job.name() << "' (" << tessera::ModeName(job.consistency()) << "), "
            << options.servers << " servers, " << options.workers << " workers; run directory " << options.run_dir
            << std::endl;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see common/daemon/daemon_init.h
  absl::StatusOr<std::vector<std::string>> worker_command = TakeWorkerCommand(argc, argv);
  if (worker_command.ok()) {
    tessera::ParseProgramFlags(
        "tessera-launch [--job=FILE] [--servers=N --workers=M --run_dir=DIR] [-- COMMAND ARGS...]\n"
        "  With -- COMMAND, each worker is that command (e.g. -- python3 train.py --lr=0.1), run once per worker with\n"
        "  TESSERA_SCHEDULER, TESSERA_RANK, TESSERA_DEVICE and the run's credentials in its environment.",
        "_main.cc", &argc, &argv);
    CheckLauncherFlags();
  }
  absl::StatusOr<tessera::LaunchOptions> options =
      worker_command.ok() ? Prepare(*std::move(worker_command)) : worker_command.status();
  if (!options.ok()) {
    std::cerr << "tessera-launch: " << options.status().message() << std::endl;
    return 2;
  }
  int signal = 0;
  absl::Status status = tessera::RunLocalCluster(*options, &signal);
  if (!status.ok()) {
    std::cerr << "tessera-launch: " << status.message() << std::endl;
    if (status.code() == absl::StatusCode::kCancelled && signal != 0) return tessera::ExitStatusAfterSignal(signal);
    return status.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  std::cout << "tessera-launch: done; metrics in " << options->run_dir << "/metrics.jsonl, summary in "
            << options->run_dir << "/summary.json" << std::endl;
  return 0;
}

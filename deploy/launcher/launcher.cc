#include "deploy/launcher/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/child_process.h"
#include "common/daemon/signals.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "deploy/launcher/credentials.h"

extern char** environ;

namespace tessera {
namespace {

constexpr char kListening[] = "scheduler listening on ";
constexpr char kDashboard[] = "dashboard at ";
constexpr char kSummary[] = "summary: ";
// The scheduler's line for a rank taken for the first time: "worker 3 joined the job" (scheduler/progress_records).
constexpr char kWorkerPrefix[] = "worker ";
constexpr char kJoinedSuffix[] = " joined the job";
// And for a worker's first step done: "worker 3 finished its first step" (ProgressRecords::kFirstStepSuffix).
constexpr char kFirstStepSuffix[] = " finished its first step";
constexpr absl::Duration kGrace = absl::Seconds(5);
// How long after a worker's exit its "joined" line may still be on its way from the scheduler.
constexpr absl::Duration kJoinSettle = absl::Milliseconds(500);
constexpr int kSchedulerHeartbeatTimeoutMs = 10000;  // tessera-scheduler's default --heartbeat_timeout_ms

struct Child {
  enum Role { kScheduler, kServer, kWorker };
  Role role = kServer;
  std::string name;
  std::string log;
  std::vector<std::string> argv;  // to start it again
  std::vector<std::string> environment;  // its own settings, added to the launcher's environment
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
  int restarts = 0;
  int rank = -1;            // workers: the rank it asks for
  std::string cgroup_procs; // workers under a CPU quota: the group it joins (again when restarted)
  absl::Time exited_at;     // when it last exited
};

// The rank of the scheduler's "worker N<suffix>" line; nullopt for any other line.
std::optional<int> WorkerRankOf(absl::string_view line, absl::string_view suffix) {
  int rank = -1;
  if (!absl::ConsumePrefix(&line, kWorkerPrefix) || !absl::ConsumeSuffix(&line, suffix) ||
      !absl::SimpleAtoi(line, &rank)) {
    return std::nullopt;
  }
  return rank;
}

// The last line of `log` that is not blank (a traceback's error, a daemon's last word), at most 300 bytes.
std::string LastLine(const std::string& log) {
  std::string tail = TailOfFile(log, 20);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ' || tail.back() == '\r')) tail.pop_back();
  std::string line = tail.substr(tail.rfind('\n') == std::string::npos ? 0 : tail.rfind('\n') + 1);
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

sigset_t LauncherSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGUSR1);
  return set;
}

// The launcher's environment without TESSERA_* variables: those set the launcher's own flags, and each child gets
// its settings as flags (a TESSERA_HTTP_PORT meant for one daemon must not reach every child).
std::vector<std::string> ChildEnvironment() {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!absl::StartsWith(*entry, "TESSERA_")) environment.emplace_back(*entry);
  }
  return environment;
}

// Forks and execs `argv`; stdout goes to `stdout_fd` (or the log), stderr to the log (appended to when
// `append`: a restarted child).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log, int stdout_fd,
                            bool append = false, const std::vector<std::string>& own_environment = {},
                            const std::string& cgroup_procs = "") {
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log, ": ", strerror(errno)));
  ChildOptions child;
  child.argv = argv;
  std::vector<std::string> environment = ChildEnvironment();
  for (const std::string& entry : own_environment) {  // a variable of its own replaces the launcher's
    const std::string key = entry.substr(0, entry.find('=') + 1);
    environment.erase(std::remove_if(environment.begin(), environment.end(),
                                     [&](const std::string& e) { return absl::StartsWith(e, key); }),
                      environment.end());
    environment.push_back(entry);
  }
  child.environment = std::move(environment);
  child.stdout_fd = stdout_fd >= 0 ? stdout_fd : log_fd;
  child.stderr_fd = log_fd;
  child.parent_death_signal = SIGTERM;  // never outlive the launcher; its own group: Ctrl-C reaches only the launcher
  child.join_cgroup_procs = cgroup_procs;
  absl::StatusOr<pid_t> pid = StartChild(child);
  close(log_fd);
  return pid;
}

class Cluster {
 public:
  explicit Cluster(const LaunchOptions& options) : options_(options) {}

  // A worker command's settings, as the TESSERA_ variables tessera-worker's flags read (tessera.connect() reads
  // them the same way), and the build's Python package first on PYTHONPATH when the build has one.
  std::vector<std::string> WorkerCommandEnvironment(const std::string& scheduler, int rank,
                                                    const std::string& device) const {
    std::vector<std::string> env = {"TESSERA_SCHEDULER=" + scheduler, absl::StrCat("TESSERA_RANK=", rank),
                                    "TESSERA_DEVICE=" + device};
    const SecurityOptions& s = options_.security;
    if (!s.token_file.empty()) env.push_back("TESSERA_TOKEN_FILE=" + s.token_file);
    if (!s.tls_cert.empty()) env.push_back("TESSERA_TLS_CERT=" + s.tls_cert);
    if (!s.tls_key.empty()) env.push_back("TESSERA_TLS_KEY=" + s.tls_key);
    if (!s.tls_ca.empty()) env.push_back("TESSERA_TLS_CA=" + s.tls_ca);
    const std::string package = options_.bin_dir + "/../python";
    if (std::filesystem::exists(package + "/tessera/__init__.py")) {
      const char* path = std::getenv("PYTHONPATH");
      env.push_back("PYTHONPATH=" + package + (path != nullptr && *path != '\0' ? absl::StrCat(":", path) : ""));
    }
    return env;
  }

  // The run's credentials, as every daemon's flags (the token travels as a file name, never as itself).
  void AddSecurityFlags(std::vector<std::string>& argv) const {
    const SecurityOptions& s = options_.security;
    if (!s.token_file.empty()) argv.push_back("--token_file=" + s.token_file);
    if (!s.tls_cert.empty()) argv.push_back("--tls_cert=" + s.tls_cert);
    if (!s.tls_key.empty()) argv.push_back("--tls_key=" + s.tls_key);
    if (!s.tls_ca.empty()) argv.push_back("--tls_ca=" + s.tls_ca);
  }

  absl::Status Run() {
    sigset_t signals = LauncherSignals();
    sigprocmask(SIG_BLOCK, &signals, nullptr);
    std::error_code error;
    std::filesystem::create_directories(options_.run_dir + "/logs", error);
    if (error) return absl::PermissionDeniedError(absl::StrCat("cannot create ", options_.run_dir, ": ", error.message()));

    if (options_.security.token_file.empty()) {
      absl::StatusOr<SecurityOptions> made = MakeRunCredentials(options_.run_dir + "/secrets", options_.tls);
      if (!made.ok()) return made.status();
      options_.security = *made;
    }
    if (absl::Status s = MakeQuotaGroups(); !s.ok()) return s;
    const absl::Time start = absl::Now();
    if (!options_.resume_dir.empty()) {
      // The run being resumed ended with a summary; the resumed run writes its own.
      std::filesystem::rename(options_.run_dir + "/summary.json", options_.run_dir + "/summary-before-resume.json",
                              error);
    }
    absl::Status status = StartAll();
    if (status.ok()) status = Supervise();
    StopAll();
    // A signal while the dashboard lingers after a completed job only cuts the linger short.
    if (status.ok() && interrupted_ != 0 && !SummarySaysCompleted()) {
      status = absl::CancelledError(absl::StrCat("stopped by ", SignalName(interrupted_)));
    }
    // Every run ends with a summary: the scheduler writes it; when it could not (it died, or never started), the
    // launcher says why the run ended.
    if (!std::filesystem::exists(options_.run_dir + "/summary.json")) {
      WriteFallbackSummary(status, absl::Now() - start);
    } else if (ended_by_launcher_) {
      AmendSummary(status);
    }
    return status;
  }

  int interrupted() const { return interrupted_; }

 private:
  bool SummarySaysCompleted() const {
    std::ifstream in(options_.run_dir + "/summary.json");
    const nlohmann::json summary = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return summary.is_object() && summary.value("completed", false);
  }

  // The launcher ended the run (CheckWorkersLeft): the summary the scheduler wrote on its way out says "stopped by
  // SIGTERM"; the reason is the launcher's.
  void AmendSummary(const absl::Status& status) const {
    const std::string path = options_.run_dir + "/summary.json";
    nlohmann::json summary;
    {
      std::ifstream in(path);
      summary = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    }
    if (!summary.is_object()) return;
    summary["completed"] = false;
    summary["stop_reason"] = std::string(status.message());
    summary["stopped_by"] = "tessera-launch";
    std::ofstream out(path + ".tmp");
    out << summary.dump(2) << "\n";
    out.close();
    std::filesystem::rename(path + ".tmp", path);
  }

  void WriteFallbackSummary(const absl::Status& status, absl::Duration wall) const {
    nlohmann::json summary = {{"completed", false},
                              {"stop_reason", status.ok() ? "the scheduler exited without a summary"
                                                          : std::string(status.message())},
                              {"written_by", "tessera-launch (the scheduler wrote no summary)"},
                              {"servers", options_.servers},
                              {"workers", options_.workers},
                              {"wall_seconds", absl::ToDoubleSeconds(wall)}};
    std::ofstream out(options_.run_dir + "/summary.json");
    out << summary.dump(2) << "\n";
  }

  // Starts the scheduler; `again`: the one that died (it is started again with its command line, on the port it
  // had, so that the servers and workers come back to it and it takes the job back).
  absl::Status StartScheduler(Child* again = nullptr) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    if (again != nullptr) {
      if (reader_.joinable()) reader_.join();  // the dead one's output is read to its end
      absl::StatusOr<pid_t> pid = Spawn(again->argv, again->log, pipe_fds[1], /*append=*/true);
      close(pipe_fds[1]);
      if (!pid.ok()) {
        close(pipe_fds[0]);
        return pid.status();
      }
      again->pid = *pid;
      again->exited = false;
      scheduler_exited_ = false;
      ReadSchedulerOutput(pipe_fds[0]);
      return absl::OkStatus();
    }
    std::vector<std::string> argv = {options_.bin_dir + "/tessera-scheduler", "--job=" + options_.job_path,
                                     "--run_dir=" + options_.run_dir, "--port=0",
                                     absl::StrCat("--linger_s=", options_.linger_s)};
    if (!options_.resume_dir.empty()) argv.push_back("--resume=" + options_.resume_dir);
    if (options_.heartbeat_timeout_ms > 0) {
      argv.push_back(absl::StrCat("--heartbeat_timeout_ms=", options_.heartbeat_timeout_ms));
      // Beats often enough that a timeout of a second or two is not a false alarm.
      argv.push_back(absl::StrCat("--heartbeat_interval_ms=", std::max(20, options_.heartbeat_timeout_ms / 10)));
    }
    if (options_.servers > 0) argv.push_back(absl::StrCat("--num_servers=", options_.servers));
    if (options_.workers > 0) argv.push_back(absl::StrCat("--num_workers=", options_.workers));
    AddSecurityFlags(argv);
    absl::StatusOr<pid_t> pid = Spawn(argv, options_.run_dir + "/logs/scheduler.log", pipe_fds[1], append_logs());
    close(pipe_fds[1]);
    if (!pid.ok()) {
      close(pipe_fds[0]);
      return pid.status();
    }
    children_.push_back({Child::kScheduler, "scheduler", options_.run_dir + "/logs/scheduler.log", argv, {}, *pid});
    ReadSchedulerOutput(pipe_fds[0]);
    return absl::OkStatus();
  }

  // Forwards the scheduler's stdout (progress lines) from `fd` and picks up its address from its first line.
  void ReadSchedulerOutput(int fd) {
    const pid_t self = getpid();
    reader_ = std::thread([this, fd, self] {
      std::string pending;
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
        pending.append(buffer, n);
        size_t newline;
        while ((newline = pending.find('\n')) != std::string::npos) {
          std::string line = pending.substr(0, newline);
          pending.erase(0, newline + 1);
          if (absl::StartsWith(line, kDashboard)) {
            std::cout << "tessera-launch: dashboard at " << line.substr(strlen(kDashboard)) << std::endl;
            continue;
          }
          if (std::optional<int> rank = WorkerRankOf(line, kJoinedSuffix)) {
            std::lock_guard<std::mutex> lock(mu_);
            joined_ranks_.insert(*rank);
            continue;  // the launcher's to know, not its user's
          }
          if (std::optional<int> rank = WorkerRankOf(line, kFirstStepSuffix)) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              stepped_ranks_.insert(*rank);
            }
            if (!options_.worker_cpu_quota.empty()) kill(self, SIGUSR1);  // its quota is to be set now
            continue;
          }
          if (absl::StartsWith(line, kSummary)) job_ended_ = true;
          if (absl::StartsWith(line, kListening)) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              scheduler_address_ = line.substr(strlen(kListening));
            }
            kill(self, SIGUSR1);
          }
          std::cout << line << std::endl;
          if (absl::StartsWith(line, kSummary) && options_.linger_s > 0 && interrupted_ == 0) {
            std::cout << "tessera-launch: the job has ended; the dashboard stays up for " << options_.linger_s
                      << " s (--linger_s; Ctrl-C to leave now)" << std::endl;
          }
        }
      }
      close(fd);
    });
  }

  // A resumed run adds to the logs of the run it continues.
  bool append_logs() const { return !options_.resume_dir.empty(); }

  absl::Status StartAll() {
    if (absl::Status s = StartScheduler(); !s.ok()) return s;
    // Wait for the address (SIGUSR1 from the reader), or for the scheduler to die.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!scheduler_address_.empty()) break;
      }
      if (absl::Status s = WaitForEvent(deadline, "the scheduler to listen"); !s.ok()) return s;
      if (scheduler_exited_) {
        return interrupted_ != 0 ? absl::CancelledError(absl::StrCat("stopped by ", SignalName(interrupted_)))
                                 : absl::AbortedError("the scheduler exited before it listened");
      }
    }
    std::string address;
    {
      std::lock_guard<std::mutex> lock(mu_);
      address = scheduler_address_;
    }
    const int servers = options_.servers;
    const int workers = options_.workers;
    for (int i = 0; i < servers; ++i) {
      const std::string log = absl::StrCat(options_.run_dir, "/logs/server-", i, ".log");
      std::vector<std::string> argv = {options_.bin_dir + "/tessera-server", "--scheduler=" + address,
                                       absl::StrCat("--id=", i)};
      if (options_.server_row_memory_mb > 0) {
        argv.push_back(absl::StrCat("--max_row_memory_mb=", options_.server_row_memory_mb));
      }
      AddSecurityFlags(argv);
      absl::StatusOr<pid_t> pid = Spawn(argv, log, -1, append_logs());
      if (!pid.ok()) return pid.status();
      children_.push_back({Child::kServer, absl::StrCat("server ", i), log, argv, {}, *pid});
    }
    for (int i = 0; i < workers; ++i) {
      const std::string log = absl::StrCat(options_.run_dir, "/logs/worker-", i, ".log");
      const std::string device =
          options_.worker_devices.empty() ? options_.device : options_.worker_devices[i % options_.worker_devices.size()];
      // Each worker asks for its rank, so that a restarted one takes its own place back at once.
      std::vector<std::string> argv, environment;
      if (!options_.worker_command.empty()) {
        argv = options_.worker_command;
        environment = WorkerCommandEnvironment(address, i, device);
      } else {
        argv = {options_.bin_dir + "/tessera-worker", "--scheduler=" + address, "--device=" + device,
                absl::StrCat("--rank=", i)};
        std::vector<std::string> straggler = options_.stalls.ToFlags();
        if (i == options_.slow_worker) absl::c_move(options_.slow.ToFlags(), std::back_inserter(straggler));
        argv.insert(argv.end(), straggler.begin(), straggler.end());
        if (options_.simulate_compute_ms > 0) {
          argv.push_back(absl::StrCat("--simulate_compute_ms=", options_.simulate_compute_ms));
        }
        // Every worker gets it; only the one that registers as rank 0 writes it.
        if (!options_.dump_params.empty()) argv.push_back("--dump_params=" + options_.dump_params);
        AddSecurityFlags(argv);
      }
      const std::string cgroup = quota_groups_.empty() ? "" : quota_groups_[i]->procs_file();
      absl::StatusOr<pid_t> pid = Spawn(argv, log, -1, append_logs(), environment, cgroup);
      if (!pid.ok()) return Annotate(pid.status(), absl::StrCat("worker ", i));
      children_.push_back({Child::kWorker, absl::StrCat("worker ", i), log, argv, environment, *pid});
      children_.back().rank = i;
      children_.back().cgroup_procs = cgroup;
    }
    workers_started_ = absl::Now();
    return absl::OkStatus();
  }

  // With CPU quotas: one control group per worker, made before anything starts (so that a machine without a
  // writable CPU controller fails the run at once, saying why). A worker joins its group as it starts, and its
  // quota holds from the moment the scheduler says it finished its first step: start-up (an interpreter, its
  // imports, its data) runs at the machine's speed, as a slower device's host would run it.
  absl::Status MakeQuotaGroups() {
    if (options_.worker_cpu_quota.empty()) return absl::OkStatus();
    CpuQuotaGroup::RemoveLeftovers();
    for (int i = 0; i < options_.workers; ++i) {
      absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> group = CpuQuotaGroup::Create(absl::StrCat("worker-", i));
      if (!group.ok()) return Annotate(group.status(), "--worker_cpu_quota");
      quota_groups_.push_back(*std::move(group));
      quota_cpus_.push_back(options_.worker_cpu_quota[i % options_.worker_cpu_quota.size()]);
    }
    quota_applied_.assign(options_.workers, false);
    return absl::OkStatus();
  }

  // Sets worker i's quota, prints it and records it in RUN_DIR/cpu_quotas.jsonl ({"worker", "cpus", "reason",
  // "after_seconds" since the workers started, "unix_seconds"}).
  absl::Status SetQuota(size_t i, const std::string& reason) {
    const double cpus = quota_cpus_[i];
    if (absl::Status s = quota_groups_[i]->SetCpus(cpus); !s.ok()) return s;
    const absl::Time now = absl::Now();
    const double after = absl::ToDoubleSeconds(now - workers_started_);
    std::ofstream(options_.run_dir + "/cpu_quotas.jsonl", std::ios::app)
        << nlohmann::json({{"worker", i}, {"cpus", cpus}, {"reason", reason}, {"after_seconds", after},
                           {"unix_seconds", absl::ToDoubleSeconds(now - absl::UnixEpoch())}})
               .dump()
        << "\n";
    std::cout << "tessera-launch: worker " << i << " " << reason << ": CPU quota "
              << (cpus > 0 ? absl::StrCat(cpus, " CPUs") : std::string("none")) << " ("
              << quota_groups_[i]->Describe() << ")" << std::endl;
    return absl::OkStatus();
  }

  // Applies the quota of every worker that finished its first step since, and every change whose time has come.
  absl::Status ApplyQuotas() {
    if (quota_groups_.empty()) return absl::OkStatus();
    std::set<int> stepped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stepped = stepped_ranks_;
    }
    for (int rank : stepped) {
      if (rank < 0 || rank >= static_cast<int>(quota_applied_.size()) || quota_applied_[rank]) continue;
      quota_applied_[rank] = true;
      if (absl::Status s = SetQuota(rank, "finished its first step"); !s.ok()) return s;
    }
    const std::vector<CpuQuotaChange>& changes = options_.worker_cpu_quota_changes;
    while (next_quota_change_ < changes.size() &&
           absl::Now() - workers_started_ >= absl::Seconds(changes[next_quota_change_].after_seconds)) {
      const CpuQuotaChange& change = changes[next_quota_change_++];
      const std::string reason = absl::StrCat("at ", change.after_seconds, " s (--worker_cpu_quota_at)");
      for (size_t i = 0; i < quota_groups_.size(); ++i) {
        quota_cpus_[i] = change.cpus[i % change.cpus.size()];
        if (quota_applied_[i]) {
          if (absl::Status s = SetQuota(i, reason); !s.ok()) return s;
        }
      }
    }
    return absl::OkStatus();
  }

  // Waits for one signal (child exit, address, Ctrl-C) or `deadline`; reaps children. Errors: a child failed,
  // the user interrupted, or the deadline passed while waiting for `what`.
  absl::Status WaitForEvent(absl::Time deadline, const std::string& what) {
    sigset_t signals = LauncherSignals();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("timed out waiting for ", what));
    }
    timespec timeout = absl::ToTimespec(std::min(left, absl::Seconds(1)));
    const int signal = sigtimedwait(&signals, nullptr, &timeout);
    if (signal == SIGINT || signal == SIGTERM) {
      if (interrupted_ || scheduler_exited_) {
        return absl::CancelledError(absl::StrCat("interrupted again by ", SignalName(signal), "; stopping every daemon"));
      }
      // The scheduler, given the same signal, stops the job gracefully (a checkpoint when the job takes them, the
      // workers' last step, the summary naming the signal) and exits; the launcher goes on waiting for it.
      interrupted_ = signal;
      std::cout << "tessera-launch: " << SignalName(signal)
                << ": stopping the job (the workers finish their step; again to stop at once)" << std::endl;
      for (const Child& c : children_) {
        if (c.role == Child::kScheduler && !c.exited) kill(c.pid, signal);
      }
    }
    return Reap();
  }

  // Takes the children that exited. The scheduler decides the job's fate: when it exits, the job is over
  // (an error when it says the job did not complete, naming what failed). A server or worker that fails is
  // reported; a worker is started again (with its rank) while it has restarts left, and otherwise the job goes
  // on without it for as long as the scheduler lets it (Supervise ends the run when its rank never joined).
  absl::Status Reap() {
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Child& child : children_) {
        if (child.pid != pid || child.exited) continue;
        child.exited = true;
        child.status = status;
        child.exited_at = absl::Now();
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        // A scheduler stopped by the signal the launcher passed on exits as that signal asks (0 or 130).
        const bool stopped_as_asked = interrupted_ != 0 && WIFEXITED(status) &&
                                      WEXITSTATUS(status) == ExitStatusAfterSignal(interrupted_);
        if (child.role == Child::kScheduler) {
          scheduler_exited_ = true;
          // A scheduler that died (a signal, or exit 1: not a job that ended, exit 3, nor bad flags, exit 2) is
          // started again while it has restarts left, on its port: the servers and workers wait for it.
          const bool died = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 1);
          if (died && interrupted_ == 0 && child.restarts < options_.restart_scheduler) {
            ++child.restarts;
            std::string address;
            {
              std::lock_guard<std::mutex> lock(mu_);
              address = scheduler_address_;
            }
            for (std::string& arg : child.argv) {
              if (arg == "--port=0") arg = absl::StrCat("--port=", address.substr(address.rfind(':') + 1));
            }
            std::cout << "tessera-launch: the scheduler died (" << ExitStatusText(status) << "); starting it again ("
                      << child.restarts << " of " << options_.restart_scheduler << " restarts): it takes the job "
                      << "back from the servers and workers" << std::endl;
            if (absl::Status s = StartScheduler(&child); !s.ok()) return s;
            break;
          }
          if (failed && !stopped_as_asked) {
            return absl::AbortedError(absl::StrCat("the scheduler ended the job without completing it (",
                                                   ExitStatusText(status), "); end of ", child.log, ":\n",
                                                   TailOfFile(child.log, 15)));
          }
          continue;
        }
        if (!failed || scheduler_exited_) continue;
        std::cout << "tessera-launch: " << child.name << " failed (" << ExitStatusText(status) << "); end of "
                  << child.log << ":\n" << TailOfFile(child.log, 5);
        if (!absl::EndsWith(TailOfFile(child.log, 1), "\n")) std::cout << "\n";
        const int budget = child.role == Child::kWorker ? options_.restart_workers : options_.restart_servers;
        if (child.restarts < budget) {
          ++child.restarts;
          absl::StatusOr<pid_t> again =
              Spawn(child.argv, child.log, -1, /*append=*/true, child.environment, child.cgroup_procs);
          if (!again.ok()) return again.status();
          child.pid = *again;
          child.exited = false;
          std::cout << "tessera-launch: restarted " << child.name << " (" << child.restarts << " of " << budget
                    << " restarts)" << std::endl;
        } else {
          // Supervise ends the run when its rank had not joined (the scheduler would wait for it forever).
          std::cout << "tessera-launch: " << child.name << " has no restarts left; the scheduler decides whether the "
                    << "job goes on without it" << std::endl;
        }
      }
    }
    return absl::OkStatus();
  }

  // Whether the job can still end by itself once workers have exited for good (no restarts left). A rank whose
  // command exited before it joined can never join, and the scheduler would wait for it forever:
  // FAILED_PRECONDITION naming each such worker's error. Once every worker has exited (some after joining), the
  // scheduler ends the job by its rule (a worker that failed or fell silent is lost within its heartbeat
  // timeout, then the job ends); DEADLINE_EXCEEDED when it has not within twice that time and a grace.
  absl::Status CheckWorkersLeft() {
    if (job_ended_ || interrupted_ != 0) return absl::OkStatus();  // the scheduler is ending the job
    std::set<int> joined;
    {
      std::lock_guard<std::mutex> lock(mu_);
      joined = joined_ranks_;
    }
    const absl::Time now = absl::Now();
    std::vector<const Child*> never_joined, exited;
    bool any_failed = false, settling = false;
    for (const Child& c : children_) {
      if (c.role != Child::kWorker || !c.exited) continue;
      any_failed |= !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
      exited.push_back(&c);
      if (joined.count(c.rank) != 0) continue;
      if (now - c.exited_at < kJoinSettle) {
        settling = true;
        continue;
      }
      never_joined.push_back(&c);
    }
    // "worker 1 (exit code 1): ModuleNotFoundError: ..." for each.
    auto describe = [&joined](const std::vector<const Child*>& children) {
      std::vector<std::string> parts;
      for (const Child* c : children) {
        const std::string last = LastLine(c->log);
        const bool clean = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
        parts.push_back(absl::StrCat(c->name, " (", ExitStatusText(c->status), ")", last.empty() ? "" : ": ", last,
                                     clean && joined.count(c->rank) == 0 ? " (it exited without joining the job)" : ""));
      }
      return absl::StrJoin(parts, "; ");
    };
    if (settling) return absl::OkStatus();  // each error is named once its worker is known not to have joined
    if (!never_joined.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          joined.empty() && exited.size() == static_cast<size_t>(options_.workers) ? "no worker could join the job"
                                                                                  : "a worker can never join the job",
          " (its command exited before it joined, and it has no restarts left; see ", options_.run_dir,
          "/logs/): ", describe(never_joined)));
    }
    if (exited.size() < static_cast<size_t>(options_.workers)) return absl::OkStatus();
    const absl::Duration timeout =
        absl::Milliseconds(options_.heartbeat_timeout_ms > 0 ? options_.heartbeat_timeout_ms : kSchedulerHeartbeatTimeoutMs);
    const absl::Duration bound = 2 * timeout + kGrace;
    if (all_workers_gone_since_ == absl::InfiniteFuture()) {
      all_workers_gone_since_ = now;
      // (Workers that all exited 0 said Done: the summary is on its way.)
      if (any_failed) std::cout << "tessera-launch: every worker has exited; the scheduler ends the job by its rule (a worker that "
                << "failed or fell silent is lost within its heartbeat timeout, "
                << absl::FormatDuration(timeout) << ")" << std::endl;
    }
    if (now - all_workers_gone_since_ < bound) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat("every worker has exited (", describe(exited),
                                                    ") and the scheduler did not end the job within ",
                                                    absl::FormatDuration(bound), "; stopping it"));
  }

  bool AllExited() const {
    for (const Child& c : children_) {
      if (!c.exited) return false;
    }
    return true;
  }

  // Until the scheduler has exited (the job is over), then until the others have (they exit when the job ends;
  // those still running after the grace period are stopped).
  absl::Status Supervise() {
    const absl::Time deadline =
        options_.timeout_s > 0 ? absl::Now() + absl::Seconds(options_.timeout_s) : absl::InfiniteFuture();
    while (!scheduler_exited_) {
      if (absl::Status s = WaitForEvent(deadline, "the job to finish"); !s.ok()) {
        if (absl::IsDeadlineExceeded(s)) {
          return absl::DeadlineExceededError(absl::StrCat("--timeout_s=", options_.timeout_s, " passed; stopping the cluster"));
        }
        return s;
      }
      if (absl::Status s = CheckWorkersLeft(); !s.ok() && !scheduler_exited_) {
        ended_by_launcher_ = true;
        return s;
      }
      if (absl::Status s = ApplyQuotas(); !s.ok()) return s;
    }
    const absl::Time grace = std::min(deadline, absl::Now() + kGrace);
    while (!AllExited() && absl::Now() < grace) {
      if (absl::Status s = WaitForEvent(grace, "the daemons to exit"); !s.ok() && !absl::IsDeadlineExceeded(s)) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // SIGTERM to every child still running, SIGKILL after the grace period; reaps them all.
  void StopAll() {
    for (const Child& c : children_) {
      if (!c.exited) kill(c.pid, SIGTERM);
    }
    const absl::Time deadline = absl::Now() + kGrace;
    for (Child& c : children_) {
      while (!c.exited) {
        int status = 0;
        const pid_t pid = waitpid(c.pid, &status, WNOHANG);
        if (pid == c.pid) {
          c.exited = true;
          break;
        }
        if (absl::Now() > deadline) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &status, 0);
          c.exited = true;
          break;
        }
        // Reaping a child that was sent SIGTERM: short pauses bounded by the grace period.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (reader_.joinable()) reader_.join();  // the pipe closes once the scheduler is gone
  }

  LaunchOptions options_;  // its credentials are filled in by Run()
  std::vector<Child> children_;
  bool scheduler_exited_ = false;
  bool ended_by_launcher_ = false;  // Supervise ended the run (CheckWorkersLeft), not the scheduler
  std::atomic<int> interrupted_{0};  // the signal that asked the job to stop (read by the reader thread too)
  std::thread reader_;
  std::atomic<bool> job_ended_{false};  // the scheduler printed its summary line (set by the reader thread)
  absl::Time all_workers_gone_since_ = absl::InfiniteFuture();  // every worker exited for good, since then
  std::mutex mu_;
  std::string scheduler_address_;  // guarded by mu_
  std::set<int> joined_ranks_;     // guarded by mu_: the ranks the scheduler said joined
  std::set<int> stepped_ranks_;    // guarded by mu_: the ranks the scheduler said finished their first step
  // With CPU quotas: worker i's group (removed when the Cluster goes, after every child was reaped).
  std::vector<std::unique_ptr<CpuQuotaGroup>> quota_groups_;
  std::vector<double> quota_cpus_;   // worker i's quota now (applied once it finished its first step)
  std::vector<bool> quota_applied_;  // worker i finished its first step and its quota holds
  absl::Time workers_started_;
  size_t next_quota_change_ = 0;  // the first of options_.worker_cpu_quota_changes not yet applied
};

}  // namespace

absl::Status RunLocalCluster(const LaunchOptions& options, int* stopped_by_signal) {
  Cluster cluster(options);
  absl::Status status = cluster.Run();
  if (stopped_by_signal != nullptr) *stopped_by_signal = cluster.interrupted();
  return status;
}

}  // namespace tessera

#include "tests/bench/bench_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process_report.h"

namespace tessera::bench {
namespace {

// Process groups started and not yet reaped, for KillAllProcesses.
std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::set<pid_t>& Registry() {
  static std::set<pid_t>* live = new std::set<pid_t>;
  return *live;
}

}  // namespace

std::string FindInPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(std::string name, const std::vector<std::string>& argv,
                                                        std::string log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  const std::string program = argv[0].find('/') == std::string::npos ? FindInPath(argv[0]) : argv[0];
  if (program.empty() || access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot execute ", argv[0]));
  }
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log_path, ": ", strerror(errno)));
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args[0] = const_cast<char*>(program.c_str());
  args.push_back(nullptr);
  const pid_t parent = getpid();

  std::lock_guard<std::mutex> lock(RegistryMutex());
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);                     // its own group: stopping it stops whatever it started in that group
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the benchmark blocks SIGINT/SIGTERM; the child must not
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so a kill(-pid) right away finds the group
  close(log_fd);
  Registry().insert(pid);
  return std::unique_ptr<Process>(new Process(std::move(name), std::move(log_path), pid));
}

void Process::Reaped(int status) {
  exited_ = true;
  status_ = status;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().erase(pid_);
}

bool Process::Exited() {
  if (exited_) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) Reaped(status);
  return exited_;
}

bool Process::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Exited()) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string Process::ExitText() const {
  return exited_ ? ExitStatusText(status_) : "still running";
}

bool Process::Succeeded() const { return exited_ && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }

absl::Status Process::ExitStatus() const {
  if (Succeeded()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat(name_, " failed (", ExitText(), "); end of ", log_path_, ":\n", TailOfFile(log_path_, 10)));
}

void Process::Stop(absl::Duration grace) {
  if (Exited()) return;
  kill(-pid_, SIGTERM);
  if (WaitForExit(grace)) return;
  kill(-pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  Reaped(status);
}

void KillAllProcesses() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (pid_t pid : Registry()) kill(-pid, SIGKILL);
}

}  // namespace tessera::bench

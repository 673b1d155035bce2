#include "deploy/bench/bench_process.h"

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
#include "common/base/child_process.h"

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

absl::StatusOr<std::unique_ptr<Process>> Process::Start(std::string name, const std::vector<std::string>& argv,
                                                        std::string log_path) {
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log_path, ": ", strerror(errno)));
  ChildOptions child;
  child.argv = argv;
  child.stdin_fd = ChildOptions::kDevNull;
  child.stdout_fd = child.stderr_fd = log_fd;
  child.parent_death_signal = SIGKILL;  // never outlive the benchmark
  std::lock_guard<std::mutex> lock(RegistryMutex());
  absl::StatusOr<pid_t> started = StartChild(child);
  close(log_fd);
  if (!started.ok()) return started.status();
  const pid_t pid = *started;
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

#include "common/base/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace tessera {

std::string FindInPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<pid_t> StartChild(const ChildOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("empty command");
  const std::string& name = options.argv[0];
  const std::string program = name.find('/') == std::string::npos ? FindInPath(name) : name;
  if (program.empty() || access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot execute ", name));
  }
  std::vector<char*> args;
  for (const std::string& a : options.argv) args.push_back(const_cast<char*>(a.c_str()));
  args[0] = const_cast<char*>(program.c_str());
  args.push_back(nullptr);
  std::vector<char*> envp;
  if (options.environment) {
    for (const std::string& e : *options.environment) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  char* const* child_environment = options.environment ? envp.data() : environ;
  const int null_fd = options.stdin_fd == ChildOptions::kDevNull ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    if (null_fd >= 0) close(null_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    if (options.own_process_group) setpgid(0, 0);
    if (options.parent_death_signal != 0) {
      prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
      if (getppid() != parent) _exit(1);  // the parent died before the request took effect
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // daemons block signals for their watcher; the child must not
    if (!options.join_cgroup_procs.empty()) {
      const int procs = open(options.join_cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
      // "0" is the writing process itself (and so every thread it will start).
      if (procs < 0 || write(procs, "0", 1) != 1) {
        dprintf(options.stderr_fd >= 0 ? options.stderr_fd : STDERR_FILENO, "cannot join the control group %s: %s\n",
                options.join_cgroup_procs.c_str(), strerror(errno));
        _exit(126);
      }
      close(procs);
    }
    const int stdin_fd = options.stdin_fd == ChildOptions::kDevNull ? null_fd : options.stdin_fd;
    if (stdin_fd >= 0) dup2(stdin_fd, STDIN_FILENO);
    if (options.stdout_fd >= 0) dup2(options.stdout_fd, STDOUT_FILENO);
    if (options.stderr_fd >= 0) dup2(options.stderr_fd, STDERR_FILENO);
    execve(args[0], args.data(), child_environment);
    dprintf(STDERR_FILENO, "cannot execute %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  if (options.own_process_group) setpgid(pid, pid);  // also from the parent: a kill(-pid) right away finds it
  if (null_fd >= 0) close(null_fd);
  return pid;
}

absl::StatusOr<int> RunChild(const ChildOptions& options) {
  absl::StatusOr<pid_t> pid = StartChild(options);
  if (!pid.ok()) return pid.status();
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
  }
  return status;
}

std::string ExitStatusText(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("signal ", WTERMSIG(wait_status));
  return "unknown status";
}

std::string TailOfFile(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

}  // namespace tessera

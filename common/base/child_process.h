// Child processes: the one place that forks and execs, for the launcher (daemons, openssl), the benchmarks and
// the soak run, and the words for how a child ended.
//
//   ChildOptions child;
//   child.argv = {bin + "/tessera-server", "--scheduler=" + address};
//   child.stdout_fd = child.stderr_fd = log_fd;
//   child.parent_death_signal = SIGTERM;
//   absl::StatusOr<pid_t> pid = StartChild(child);
#ifndef TESSERA_COMMON_BASE_CHILD_PROCESS_H_
#define TESSERA_COMMON_BASE_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

struct ChildOptions {
  // argv[0]: a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  // The child's whole environment; nullopt: this process's.
  std::optional<std::vector<std::string>> environment;
  // Descriptors the child gets as its standard streams; -1: this process's own. stdin may also be kDevNull.
  static constexpr int kDevNull = -2;
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // A process group of its own (a Ctrl-C at the terminal reaches only the parent, and a kill of -pid reaches
  // whatever the child starts in its group).
  bool own_process_group = true;
  // Sent to the child when this process dies (0: none), so that no child outlives its parent.
  int parent_death_signal = 0;
  // When set, a control group's cgroup.procs file: the child moves itself into that group before it execs, so the
  // group's limits (a CPU quota) hold from its first instruction. A child that cannot join ends with exit code
  // 126 and a line on its stderr.
  std::string join_cgroup_procs;
};

// Forks and execs. Everything the child needs is prepared before the fork; between fork and exec only
// async-signal-safe calls run, and the child starts with no signal blocked. A program that cannot be executed is
// NOT_FOUND before anything starts; an exec that fails all the same ends the child with exit code 127 and a line
// on its stderr.
absl::StatusOr<pid_t> StartChild(const ChildOptions& options);

// StartChild, then waits for the child's end: its waitpid() status.
absl::StatusOr<int> RunChild(const ChildOptions& options);

// The path of an executable `program` in PATH ("" when there is none).
std::string FindInPath(const std::string& program);

// "exit code 1", "signal 9", from a waitpid() status.
std::string ExitStatusText(int wait_status);

// The last `lines` lines of a text file, joined by newlines ("" when unreadable).
std::string TailOfFile(const std::string& path, int lines);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_CHILD_PROCESS_H_

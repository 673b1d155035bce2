// Runs a real binary for multi-process tests: stdout and stderr merged into one pipe the test reads with
// deadlines, and the exit status.
//
//   Subprocess p({bin + "/tessera-worker", "--scheduler=127.0.0.1:1"});
//   ASSERT_TRUE(p.ReadUntilExit(absl::Seconds(60)));
//   EXPECT_EQ(p.exit_code(), 1);
#ifndef TESSERA_TESTS_TESTING_SUBPROCESS_H_
#define TESSERA_TESTS_TESTING_SUBPROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/child_process.h"

namespace tessera::testing {

// Not thread-safe.
class Subprocess {
 public:
  explicit Subprocess(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    ChildOptions child;
    child.argv = argv;
    child.stdout_fd = child.stderr_fd = fds[1];
    child.own_process_group = false;
    absl::StatusOr<pid_t> pid = StartChild(child);
    close(fds[1]);
    fd_ = fds[0];
    if (!pid.ok()) {  // as a shell says it: the output names the cause, the exit code is 127
      output_ = std::string(pid.status().message()) + "\n";
      status_ = 127 << 8;
      closed_ = reaped_ = true;
      return;
    }
    pid_ = *pid;
  }

  ~Subprocess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads output until it contains `text` (true) or the pipe closes or `timeout` passes (false).
  bool ReadUntil(const std::string& text, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (output_.find(text) == std::string::npos) {
      if (!ReadSome(deadline)) return false;
    }
    return true;
  }

  // Reads until a whole line (ending in a newline) contains `text`; false as ReadUntil.
  bool ReadUntilLine(const std::string& text, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const size_t at = output_.find(text);
      if (at != std::string::npos && output_.find('\n', at) != std::string::npos) return true;
      if (!ReadSome(deadline)) return false;
    }
  }

  // Reads until a whole line satisfies `matches`; false as ReadUntil.
  bool ReadUntilLineWhere(const std::function<bool(std::string_view line)>& matches, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    size_t start = 0;  // the first line not looked at yet
    while (true) {
      for (size_t end; (end = output_.find('\n', start)) != std::string::npos; start = end + 1) {
        if (matches(std::string_view(output_).substr(start, end - start))) return true;
      }
      if (!ReadSome(deadline)) return false;
    }
  }

  // Reads to the end of the output, then reaps the process. False if that takes longer than `timeout` (the
  // process is then killed).
  bool ReadUntilExit(absl::Duration timeout) {
    if (reaped_) return true;
    const absl::Time deadline = absl::Now() + timeout;
    while (ReadSome(deadline)) {
    }
    if (!closed_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      reaped_ = true;
      return false;
    }
    waitpid(pid_, &status_, 0);  // the output closed: the process is exiting
    reaped_ = true;
    return true;
  }

  // The exit code, or 128 + signal.
  int exit_code() const {
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
    return -1;
  }

 private:
  // One read with the time left; false at end of output or at the deadline.
  bool ReadSome(absl::Time deadline) {
    if (closed_) return false;
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left_ms)) <= 0) return false;
    char buffer[4096];
    const ssize_t n = read(fd_, buffer, sizeof(buffer));
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    output_.append(buffer, n);
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = 0;
  bool closed_ = false;
  bool reaped_ = false;
  std::string output_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_SUBPROCESS_H_

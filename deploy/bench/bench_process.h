// Child processes for the benchmark: each in a process group of its own, output in a log file, killed when
// the benchmark ends by any path (destructor, KillAllProcesses() from a signal watcher, PR_SET_PDEATHSIG when
// the benchmark itself dies).
//
//   auto p = Process::Start("server 0", {bin + "/tessera-server", "--scheduler=" + address}, dir + "/server-0.log");
//   if (!p.ok()) return p.status();
//   ...
//   (*p)->Stop();   // SIGTERM to its group, SIGKILL after the grace period; also what the destructor does
#ifndef TESSERA_DEPLOY_BENCH_BENCH_PROCESS_H_
#define TESSERA_DEPLOY_BENCH_BENCH_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera::bench {

// Not thread-safe (one thread drives a Process); KillAllProcesses may run on any thread.
class Process {
 public:
  // Starts argv (argv[0]: a path, or a name looked up in PATH) with stdout and stderr appended to `log_path`.
  static absl::StatusOr<std::unique_ptr<Process>> Start(std::string name, const std::vector<std::string>& argv,
                                                        std::string log_path);
  ~Process() { Stop(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

  // True once the process has exited (reaps it without blocking).
  bool Exited();
  // Waits up to `timeout` for the process to exit; false if it is still running.
  bool WaitForExit(absl::Duration timeout);
  // After exit: "exit code 0", "signal 9".
  std::string ExitText() const;
  bool Succeeded() const;  // exited with code 0
  // OK when it exited 0; otherwise an error naming it, how it ended and the end of its log.
  absl::Status ExitStatus() const;

  // SIGTERM to the process group, SIGKILL after `grace`; reaps. No-op once exited.
  void Stop(absl::Duration grace = absl::Seconds(5));

 private:
  Process(std::string name, std::string log_path, pid_t pid)
      : name_(std::move(name)), log_path_(std::move(log_path)), pid_(pid) {}
  void Reaped(int status);

  const std::string name_;
  const std::string log_path_;
  const pid_t pid_;
  bool exited_ = false;
  int status_ = 0;
};

// SIGKILL to every process group started by Process::Start and not yet reaped. Safe to call from a signal
// watcher thread while the main thread is running.
void KillAllProcesses();

}  // namespace tessera::bench

#endif  // TESSERA_DEPLOY_BENCH_BENCH_PROCESS_H_

// Start-up shared by every Tessera binary: flags, logging, signals, and the process-wide Abseil settings.
#ifndef TESSERA_COMMON_DAEMON_DAEMON_INIT_H_
#define TESSERA_COMMON_DAEMON_DAEMON_INIT_H_

#include <functional>

#include "absl/status/status.h"

namespace tessera {

// Parses the program's flags (ParseProgramFlags in common/daemon/command_line.h: --help, --version, TESSERA_* variables,
// own flags being those of the binary's *_main.cc), logs to stderr, catches SIGINT/SIGTERM (a signal exits at
// once until the daemon gives WatchTerminationSignals its stop handler), and turns off Abseil's mutex deadlock
// detection: Debian's Abseil is built with it on, and its lock graph grows with every short-lived mutex, slowing
// a long run down step after step.
// Raises the open-descriptor limit to its hard limit, ignores SIGPIPE, and calls KeepTransientBuffersMapped. Call first in main, before any thread starts.
void InitDaemon(const char* usage, int* argc, char*** argv);

// Process-wide malloc settings for the data plane: freed message buffers stay mapped for reuse (up to 64 MiB)
// instead of being returned to the kernel and faulted in again on the next call. Call before threads start.
void KeepTransientBuffersMapped();

// How a daemon's main ends: what stops it on SIGTERM/SIGINT, what waits for its end, and the exit status of a
// failure.
struct DaemonRun {
  // Runs on the signal watcher's thread with the signal; asks the daemon to stop gracefully.
  std::function<void(int signal)> stop;
  // Blocks until the daemon has ended; its outcome (CANCELLED when a stop ended it).
  std::function<absl::Status()> wait;
  // The exit status of a failed outcome (default: 1).
  std::function<int(const absl::Status&)> failure_exit;
  // After a signal, the signal's exit status also when the daemon ended OK (a worker that finished its step).
  bool signal_status_when_ok = false;
};

// The end of every daemon's main: signals call `run.stop` while `run.wait` blocks; then the exit status: the
// signal's (ExitStatusAfterSignal) when a signal stopped the daemon, 0 when it ended OK, else "PROGRAM: status"
// on stderr and `run.failure_exit`.
int RunUntilStopped(const char* program, const DaemonRun& run);

// A start-up error: "PROGRAM: message" on stderr, and the exit status for it: 2 for what the user must fix (a
// flag, a job, a file: INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND), 1 for what may pass (a port in use).
int StartFailed(const char* program, const absl::Status& status);

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_DAEMON_INIT_H_

// SIGINT/SIGTERM handling for daemons: block the signals in every thread, and take them on one watcher thread
// that runs ordinary code (no async-signal-safety constraints).
//
//   BlockTerminationSignals();            // first thing in main, before any thread starts
//   WatchTerminationSignals([&](int sig) { daemon->Stop(...); });
#ifndef TESSERA_COMMON_SIGNALS_H_
#define TESSERA_COMMON_SIGNALS_H_

#include <functional>
#include <string>

namespace tessera {

void BlockTerminationSignals();

// Starts a detached thread that waits for SIGINT and SIGTERM and calls `on_signal` for each (a second one may
// cut a graceful stop short).
void WatchTerminationSignals(std::function<void(int)> on_signal);

// The first signal the watcher took; 0 while none came.
int ReceivedTerminationSignal();

// The exit status of a process that stopped as `signal` asked: 0 for SIGTERM (a requested stop: what systemd,
// Kubernetes and Slurm send, and count as failure unless the process exits 0), 130 for SIGINT (Ctrl-C, the
// shell's convention).
int ExitStatusAfterSignal(int signal);

// "SIGTERM", "SIGINT", or "signal N".
std::string SignalName(int signal);

}  // namespace tessera

#endif  // TESSERA_COMMON_SIGNALS_H_

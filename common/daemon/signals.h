// SIGINT/SIGTERM handling for daemons: a handler passes each signal to one watcher thread that runs ordinary code
// (no async-signal-safety constraints). Blocking the signals would not do: libraries start threads before main.
//
//   CatchTerminationSignals();            // first thing in main
//   WatchTerminationSignals(nullptr);     // a signal while starting exits at once
//   WatchTerminationSignals([&](int sig) { daemon->Stop(...); });  // once there is a daemon to stop
#ifndef TESSERA_COMMON_DAEMON_SIGNALS_H_
#define TESSERA_COMMON_DAEMON_SIGNALS_H_

#include <functional>
#include <string>

namespace tessera {

// Installs the handler (idempotent); signals wait in a pipe until the watcher thread starts.
void CatchTerminationSignals();

// Makes `on_signal` the handler of SIGINT and SIGTERM, called on a watcher thread for each (a second one may cut
// a graceful stop short), and starts that thread on the first call. With no handler (nullptr) a signal ends the
// process at once with ExitStatusAfterSignal: what a daemon wants while it is still starting, and once its
// Wait() has returned (set nullptr again before the daemon is destroyed). `on_signal` runs under a lock that
// this call takes too: it must return quickly and must not call WatchTerminationSignals.
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

#endif  // TESSERA_COMMON_DAEMON_SIGNALS_H_

// SIGINT/SIGTERM handling for daemons: block the signals in every thread, and take them on one watcher thread
// that runs ordinary code (no async-signal-safety constraints).
//
//   BlockTerminationSignals();            // first thing in main, before any thread starts
//   WatchTerminationSignals([&](int sig) { daemon->Stop(...); });
#ifndef TESSERA_COMMON_SIGNALS_H_
#define TESSERA_COMMON_SIGNALS_H_

#include <functional>

namespace tessera {

void BlockTerminationSignals();

// Starts a detached thread that waits for SIGINT or SIGTERM and then calls `on_signal` once.
void WatchTerminationSignals(std::function<void(int)> on_signal);

}  // namespace tessera

#endif  // TESSERA_COMMON_SIGNALS_H_

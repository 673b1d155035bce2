#include "common/daemon/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {
namespace {

std::atomic<int> received_signal{0};

struct Watcher {
  std::mutex mu;
  std::function<void(int)> handler;  // guarded by mu
  bool started = false;              // guarded by mu
};

Watcher& TheWatcher() {
  static auto* watcher = new Watcher();
  return *watcher;
}

// The handler only passes the signal's number to the watcher thread through this pipe (async-signal-safe);
// whichever thread the kernel picks runs it, including threads libraries started before main (OpenBLAS's).
int signal_pipe[2] = {-1, -1};

void OnTerminationSignal(int signal) {
  const int saved_errno = errno;
  const char number = static_cast<char>(signal);
  [[maybe_unused]] ssize_t written = write(signal_pipe[1], &number, 1);
  errno = saved_errno;
}

}  // namespace

void CatchTerminationSignals() {
  if (signal_pipe[0] >= 0) return;
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) return;
  struct sigaction action = {};
  action.sa_handler = OnTerminationSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

void WatchTerminationSignals(std::function<void(int)> on_signal) {
  Watcher& watcher = TheWatcher();
  std::lock_guard<std::mutex> lock(watcher.mu);
  watcher.handler = std::move(on_signal);
  if (watcher.started) return;
  watcher.started = true;
  CatchTerminationSignals();
  std::thread([&watcher] {
    while (true) {
      char number = 0;
      const ssize_t n = read(signal_pipe[0], &number, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1) break;
      const int signal = number;
      int none = 0;
      received_signal.compare_exchange_strong(none, signal);  // the first one decides the exit status
      {
        // Under the lock, so that a daemon replacing the handler (before it is destroyed) waits for this call.
        std::lock_guard<std::mutex> lock(watcher.mu);
        if (watcher.handler) {
          watcher.handler(signal);
          continue;
        }
      }
      // Nothing to stop gracefully yet (a daemon still starting, e.g. waiting for its scheduler): leave now.
      std::cerr << "stopped by " << SignalName(signal) << " while starting" << std::endl;
      google::FlushLogFiles(google::GLOG_INFO);
      _exit(ExitStatusAfterSignal(signal));
    }
  }).detach();
}

int ReceivedTerminationSignal() { return received_signal; }

int ExitStatusAfterSignal(int signal) { return signal == SIGTERM ? 0 : 128 + signal; }

std::string SignalName(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return absl::StrCat("signal ", signal);
  }
}

}  // namespace tessera

#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace {
std::atomic<int> received_signal{0};

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void WatchTerminationSignals(std::function<void(int)> on_signal) {
  std::thread([on_signal = std::move(on_signal)] {
    sigset_t set = TerminationSignals();
    int signal = 0;
    while (sigwait(&set, &signal) == 0) {
      int none = 0;
      received_signal.compare_exchange_strong(none, signal);  // the first one decides the exit status
      on_signal(signal);
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

#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>

namespace tessera {
namespace {
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
    if (sigwait(&set, &signal) == 0) on_signal(signal);
  }).detach();
}

}  // namespace tessera

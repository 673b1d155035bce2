#include "common/daemon/daemon_init.h"

#include <iostream>

#include "absl/synchronization/mutex.h"
#include "common/daemon/command_line.h"
#include "common/rpc/connection_acceptor.h"
#include "common/daemon/signals.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

#include <malloc.h>
#include <signal.h>

namespace tessera {

void KeepTransientBuffersMapped() {
  // gRPC allocates and frees a message's buffers on every call. With glibc's defaults, buffers of more than
  // 128 KiB are fresh mmaps and a freed heap top is trimmed at once, so every large message page-faults its
  // memory in again (measured: the largest kernel cost of a 16 MiB push after the TCP copies). Heap memory is
  // kept for reuse up to kMaxRetained instead.
  constexpr int kMaxRetained = 64 << 20;
  mallopt(M_MMAP_THRESHOLD, kMaxRetained / 2);
  mallopt(M_TRIM_THRESHOLD, kMaxRetained);
}

void InitDaemon(const char* usage, int* argc, char*** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  KeepTransientBuffersMapped();
  ParseProgramFlags(usage, "_main.cc", argc, argv);
  google::InitGoogleLogging((*argv)[0]);
  FLAGS_logtostderr = true;
  // A daemon holds a descriptor per connection: the soft limit (often 1024) is raised to the hard one, and the
  // listeners keep a share of it free (common/rpc/connection_acceptor.h).
  const int64_t descriptors = ConnectionAcceptor::RaiseDescriptorLimit();
  VLOG(1) << "open-descriptor limit " << descriptors;
  signal(SIGPIPE, SIG_IGN);  // a peer that hangs up mid-answer is an error on that connection, not a signal
  CatchTerminationSignals();
  WatchTerminationSignals(nullptr);  // until the daemon has started, a signal ends it at once
}

int RunUntilStopped(const char* program, const DaemonRun& run) {
  WatchTerminationSignals(run.stop);
  const absl::Status status = run.wait();
  WatchTerminationSignals(nullptr);  // the daemon is about to go; a signal now exits at once
  const int signal = ReceivedTerminationSignal();
  if (signal != 0 && (status.code() == absl::StatusCode::kCancelled || (status.ok() && run.signal_status_when_ok))) {
    LOG(INFO) << program << " stopped by " << SignalName(signal);
    return ExitStatusAfterSignal(signal);
  }
  if (status.ok()) return 0;
  std::cerr << program << ": " << status << std::endl;
  return run.failure_exit ? run.failure_exit(status) : 1;
}

int StartFailed(const char* program, const absl::Status& status) {
  std::cerr << program << ": " << status << std::endl;
  const absl::StatusCode code = status.code();
  return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kFailedPrecondition ||
                 code == absl::StatusCode::kNotFound
             ? 2
             : 1;
}

}  // namespace tessera

#include "common/daemon_init.h"

#include "absl/synchronization/mutex.h"
#include "common/signals.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

#include <cstdlib>
#include <cstring>

#include <malloc.h>

namespace tessera {

void ShowHelpAndExitIfAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      // Only this binary's own flags (defined in its *_main.cc), not every library's.
      gflags::ShowUsageWithFlagsRestrict(argv[0], "_main.cc");
      std::exit(0);
    }
  }
}

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
  gflags::SetUsageMessage(usage);
  ShowHelpAndExitIfAsked(*argc, *argv);
  gflags::ParseCommandLineFlags(argc, argv, true);
  google::InitGoogleLogging((*argv)[0]);
  FLAGS_logtostderr = true;
  BlockTerminationSignals();
}

}  // namespace tessera

#include "common/daemon_init.h"

#include "absl/synchronization/mutex.h"
#include "common/signals.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

namespace tessera {

void InitDaemon(const char* usage, int* argc, char*** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(argc, argv, true);
  google::InitGoogleLogging((*argv)[0]);
  FLAGS_logtostderr = true;
  BlockTerminationSignals();
}

}  // namespace tessera

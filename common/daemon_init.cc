#include "common/daemon_init.h"

#include "absl/synchronization/mutex.h"
#include "common/signals.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

#include <cstdlib>
#include <cstring>

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

void InitDaemon(const char* usage, int* argc, char*** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gflags::SetUsageMessage(usage);
  ShowHelpAndExitIfAsked(*argc, *argv);
  gflags::ParseCommandLineFlags(argc, argv, true);
  google::InitGoogleLogging((*argv)[0]);
  FLAGS_logtostderr = true;
  BlockTerminationSignals();
}

}  // namespace tessera

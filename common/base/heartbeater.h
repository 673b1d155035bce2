// A background duty that calls a function at a steady interval until stopped.
//
//   Heartbeater beat(absl::Milliseconds(500), [&] { return SendHeartbeat(); },
//                    [&](const absl::Status& why) { LOG(ERROR) << why; shutdown.Notify(); },
//                    /*give_up_after=*/absl::Seconds(10));
//   beat.Start();
//   ...
//   beat.Stop();  // also done by the destructor
#ifndef TESSERA_COMMON_BASE_HEARTBEATER_H_
#define TESSERA_COMMON_BASE_HEARTBEATER_H_

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

// Thread-safe. `beat` and `on_lost` run on the heartbeater's own thread.
class Heartbeater {
 public:
  // `beat` is called every `interval`. When it has failed without a success for `give_up_after`, `on_lost` is
  // called once with the last error and the heartbeater stops beating.
  Heartbeater(absl::Duration interval, std::function<absl::Status()> beat,
              std::function<void(const absl::Status&)> on_lost, absl::Duration give_up_after);
  ~Heartbeater();

  void Start();
  // Returns after the thread has exited. Idempotent.
  void Stop();

 private:
  void Run();

  const absl::Duration interval_;
  const std::function<absl::Status()> beat_;
  const std::function<void(const absl::Status&)> on_lost_;
  const absl::Duration give_up_after_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_HEARTBEATER_H_

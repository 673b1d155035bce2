// A training loop of your own against the Tessera client library: least-squares linear regression on
// synthetic data, with the weights held by the parameter servers.
//
//   tessera-scheduler --job=deploy/jobs/custom_loop.pbtxt --port=7000 --token_file=TOKEN &
//   tessera-server --scheduler=127.0.0.1:7000 --token_file=TOKEN &
//   tessera-example-linear-regression --scheduler=127.0.0.1:7000 --token_file=TOKEN
//
// Every worker of the job may run it; each fits the same hidden weights from its own samples.
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/daemon/command_line.h"
#include "common/rpc/security_flags.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "worker/client/ps_client.h"

DEFINE_string(scheduler, "", "HOST:PORT of the scheduler (required)");
DEFINE_int32(features, 64, "number of weights to fit");
DEFINE_int32(batch_size, 32, "samples per step");
TESSERA_DEFINE_SECURITY_FLAGS()

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // see common/daemon/daemon_init.h
  tessera::ParseProgramFlags("tessera-example-linear-regression --scheduler=HOST:PORT [--token_file=FILE]",
                             "linear_regression.cc", &argc, &argv);
  tessera::CheckFlags({tessera::PositiveFlag("features"), tessera::PositiveFlag("batch_size")});
  if (FLAGS_scheduler.empty()) {
    std::cerr << "tessera-example-linear-regression: --scheduler=HOST:PORT is required" << std::endl;
    return 2;
  }
  google::InitGoogleLogging(argv[0]);

  tessera::PsClient::Options options;
  options.scheduler_address = FLAGS_scheduler;
  options.security = SecurityFlags();
  absl::StatusOr<std::unique_ptr<tessera::PsClient>> client = tessera::PsClient::Connect(options);
  if (!client.ok()) {
    std::cerr << client.status() << std::endl;
    return 1;
  }
  tessera::PsClient& ps = **client;

  // One parameter, zero-initialised, cut into chunks on the servers by the job's chunk_bytes.
  tessera::v1::ParameterSpec spec;
  spec.set_name("linear/weight");
  spec.set_dtype(tessera::v1::DT_FLOAT32);
  spec.add_shape(FLAGS_features);
  if (absl::Status s = ps.Declare({spec}); !s.ok()) {
    std::cerr << s << std::endl;
    return 1;
  }

  std::mt19937 rng(1234 + ps.worker_id());
  std::normal_distribution<float> normal;
  std::vector<float> truth(FLAGS_features);
  for (int i = 0; i < FLAGS_features; ++i) truth[i] = std::sin(0.1f * i);  // what the servers should learn

  std::vector<float> w(FLAGS_features), grad(FLAGS_features), x(FLAGS_features);
  double loss = 0;
  while (true) {
    if (absl::Status s = ps.Pull({"linear/weight"}, {absl::MakeSpan(w)}); !s.ok()) {
      std::cerr << s << std::endl;
      return 1;
    }
    // Gradient of the mean of 0.5 * (w.x - y)^2 over a fresh batch.
    std::fill(grad.begin(), grad.end(), 0.0f);
    loss = 0;
    for (int n = 0; n < FLAGS_batch_size; ++n) {
      float y = 0, prediction = 0;
      for (int i = 0; i < FLAGS_features; ++i) {
        x[i] = normal(rng);
        y += truth[i] * x[i];
        prediction += w[i] * x[i];
      }
      const float error = prediction - y;
      loss += 0.5 * error * error / FLAGS_batch_size;
      for (int i = 0; i < FLAGS_features; ++i) grad[i] += error * x[i] / FLAGS_batch_size;
    }
    if (absl::Status s = ps.Push({"linear/weight"}, {absl::MakeConstSpan(grad)}, FLAGS_batch_size); !s.ok()) {
      std::cerr << s << std::endl;
      return 1;
    }
    absl::StatusOr<tessera::ClockResult> clock = ps.Clock();
    if (!clock.ok()) {
      std::cerr << clock.status() << std::endl;
      return 1;
    }
    if (clock->clock % 50 == 0) std::cout << "clock " << clock->clock << " loss " << loss << std::endl;
    if (clock->stop || clock->clock >= ps.job().stop().max_steps()) break;
  }
  std::cout << "final loss " << loss << std::endl;
  return ps.Done().ok() ? 0 : 1;
}

// A worker's lifecycle: pick a backend, join the job (or read it, in local mode), train on a thread of its own,
// and report how it ended.
//
//   WorkerOptions options;
//   options.scheduler_address = "127.0.0.1:7000";
//   TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Start(options));
//   absl::StatusOr<TrainerResult> result = worker->Wait();
#ifndef TESSERA_WORKER_WORKER_H_
#define TESSERA_WORKER_WORKER_H_

#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/daemon/http_endpoint.h"
#include "worker/backend/backend.h"
#include "worker/parameter_source.h"
#include "worker/trainer.h"
#include "worker/worker_options.h"

namespace tessera {

// A worker's /metrics page (Prometheus text format), labelled with its rank.
std::string WorkerMetricsText(const TrainerProgress& progress, int rank);

// Thread-safe.
class Worker {
 public:
  // Validates the options, creates the backend, registers with the scheduler (bounded retries; UNAVAILABLE
  // naming the address when none answers) or loads the job (local), then starts training.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Worker>> Start(const WorkerOptions& options);
  // Stops and joins.
  ~Worker();

  // Blocks until training ends; the trainer's result or error.
  [[nodiscard]] absl::StatusOr<TrainerResult> Wait();
  // The port of /healthz and /metrics; 0 when off.
  int http_port() const { return http_ ? http_->port() : 0; }
  // Asks training to stop after the current step (Wait then returns CANCELLED with `why`, which the scheduler
  // is told too). Never blocks. A worker that loses the scheduler (no answer for its heartbeat timeout, or told
  // it was replaced) stops the same way, with UNAVAILABLE naming the scheduler's address.
  void Stop(const std::string& why = "cancelled");

 private:
  Worker() = default;
  // With source_ set: the backend, the trainer, the metrics page and the training thread.
  [[nodiscard]] absl::Status StartTraining(const WorkerOptions& options);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ParameterSource> source_;
  std::unique_ptr<Trainer> trainer_;
  const std::shared_ptr<StopSignal> stop_ = std::make_shared<StopSignal>();  // shared with the trainer
  std::unique_ptr<HttpEndpoint> http_;  // reads trainer_
  std::thread thread_;
  absl::Notification finished_;
  absl::StatusOr<TrainerResult> result_ = absl::UnknownError("not finished");  // written before finished_
};

}  // namespace tessera

#endif  // TESSERA_WORKER_WORKER_H_

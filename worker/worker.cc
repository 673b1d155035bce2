#include "worker/worker.h"

#include "absl/strings/str_cat.h"
#include "common/daemon/metrics_page.h"
#include "common/model/job_spec.h"
#include "common/base/status_macros.h"
#include "glog/logging.h"

namespace tessera {

std::string WorkerMetricsText(const TrainerProgress& p, int rank) {
  const MetricLabels worker = {{"worker", absl::StrCat(rank)}};
  MetricsPage page;
  page.Family("tessera_worker_clock", MetricsPage::kGauge, "Steps this worker completed.").Sample(p.clock, worker);
  page.Family("tessera_worker_samples_total", MetricsPage::kCounter,
              "Training samples this worker computed gradients on.")
      .Sample(p.samples, worker);
  page.Family("tessera_worker_train_loss", MetricsPage::kGauge, "Mean training loss over the last reporting window.")
      .Sample(p.train_loss, worker);
  page.Family("tessera_worker_samples_per_second", MetricsPage::kGauge,
              "Training throughput over the last reporting window.")
      .Sample(p.samples_per_sec, worker);
  page.Family("tessera_worker_test_accuracy", MetricsPage::kGauge,
              "Test accuracy (0..1) of this worker's newest evaluation.")
      .Sample(p.test_accuracy, worker);
  return page.text();
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  TESSERA_RETURN_IF_ERROR(ValidateWorkerOptions(options));
  std::unique_ptr<Worker> worker(new Worker());
  if (options.local) {
    TESSERA_ASSIGN_OR_RETURN(tessera::v1::JobSpec job, LoadJobSpec(options.job_path));
    TESSERA_ASSIGN_OR_RETURN(worker->source_, LocalSource::Create(job, options.run_dir));
  } else {
    PsClient::Options client_options;
    client_options.scheduler_address = options.scheduler_address;
    client_options.device = options.device;
    client_options.rank = options.rank;
    client_options.on_scheduler_lost = [stop = worker->stop_](const absl::Status& why) { stop->Set(why); };
    client_options.connect_timeout = absl::Seconds(options.connect_timeout_s);
    client_options.clock_wait_timeout = absl::Milliseconds(options.clock_wait_timeout_ms);
    client_options.security = options.security;
    client_options.transport = options.transport;
    client_options.fabric_spin_us = options.fabric_spin_us;
    client_options.fabric_tcp = options.fabric_tcp;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(client_options));
    worker->source_ = std::make_unique<RemoteSource>(std::move(client));
  }
  // From here on the worker holds a place in the job: a failure to start tells the scheduler at once.
  if (absl::Status started = worker->StartTraining(options); !started.ok()) {
    worker->source_->Fail(started);
    return started;
  }
  return worker;
}

absl::Status Worker::StartTraining(const WorkerOptions& options) {
  // The job (known only now, for a cluster worker) picks the GEMM precision.
  BackendOptions backend_options;
  backend_options.cpu_threads = options.cpu_threads;
  backend_options.local_index = options.local_device_index;
  switch (source_->job().compute().math()) {
    case tessera::v1::ComputeSpec::TF32:
      backend_options.math = BackendOptions::Math::kTf32;
      break;
    case tessera::v1::ComputeSpec::BF16:
      backend_options.math = BackendOptions::Math::kBf16;
      break;
    default:
      break;
  }
  TESSERA_ASSIGN_OR_RETURN(backend_, CreateBackend(options.device, backend_options));
  trainer_ = std::make_unique<Trainer>(source_.get(), backend_.get(), options.trainer, stop_);
  if (options.http_port >= 0) {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const Security> security, Security::Load(options.security));
    const Trainer* trainer = trainer_.get();
    const int rank = source_->rank();
    TESSERA_ASSIGN_OR_RETURN(
        http_,
        HttpEndpoint::Start(options.listen_host, options.http_port, *security,
                            {{"/metrics", {"text/plain; version=0.0.4", [trainer, rank] {
                                return WorkerMetricsText(trainer->progress(), rank);
                              }}}}));
    LOG(INFO) << "worker " << rank << " on " << backend_->name() << "; metrics at "
              << (security->tls() ? "https" : "http") << "://"
              << options.listen_host << ":" << http_->port() << "/metrics";
  }
  thread_ = std::thread([this] {
    // Validation bounds what a job asks a worker to allocate, but this machine may still not have it: an
    // allocation that fails anywhere in training is an error the scheduler hears of and the summary names.
    try {
      result_ = trainer_->Run();
    } catch (const std::bad_alloc&) {
      result_ = absl::ResourceExhaustedError(
          "out of host memory while training: the model, batch or data set is too large for this machine");
    } catch (const std::length_error& e) {
      result_ = absl::ResourceExhaustedError(absl::StrCat("an allocation too large while training: ", e.what()));
    }
    if (!result_.ok()) source_->Fail(result_.status());
    finished_.Notify();
  });
  return absl::OkStatus();
}

Worker::~Worker() {
  http_.reset();
  Stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<TrainerResult> Worker::Wait() {
  finished_.WaitForNotification();  // the trainer's every remote wait has a deadline
  return result_;
}

void Worker::Stop(const std::string& why) {
  if (trainer_) trainer_->Cancel(why);
}

}  // namespace tessera

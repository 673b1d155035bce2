#include "tests/cluster/mini_cluster.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/job_spec.h"
#include "common/base/status_macros.h"

namespace tessera::testing {

absl::StatusOr<std::unique_ptr<MiniCluster>> MiniCluster::Start(const tessera::v1::JobSpec& job,
                                                                absl::Duration heartbeat_timeout,
                                                                const SecurityOptions& security,
                                                                int64_t server_row_memory_mb) {
  std::unique_ptr<MiniCluster> cluster(new MiniCluster());
  cluster->security_ = security;
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const Security> loaded, Security::Load(security));
  SchedulerOptions options;
  options.security = loaded;
  options.job = job;
  options.heartbeat_interval_ms = 100;
  options.heartbeat_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(heartbeat_timeout));
  TESSERA_ASSIGN_OR_RETURN(cluster->scheduler_, Scheduler::Start(options));
  for (int i = 0; i < job.cluster().num_servers(); ++i) {
    ServerOptions server_options;
    server_options.scheduler_address = cluster->scheduler_->address();
    server_options.security = loaded;
    server_options.max_row_memory_mb = server_row_memory_mb;
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(server_options));
    cluster->servers_.push_back(std::move(server));
  }
  return cluster;
}

MiniCluster::~MiniCluster() {
  servers_.clear();
  scheduler_.reset();
}

absl::StatusOr<std::unique_ptr<PsClient>> MiniCluster::ConnectClient(bool heartbeat,
                                                                    const SecurityOptions* security) {
  PsClient::Options options;
  options.security = security != nullptr ? *security : security_;
  options.scheduler_address = scheduler_->address();
  options.heartbeat = heartbeat;
  options.clock_wait_timeout = absl::Seconds(60);
  return PsClient::Connect(options);
}

absl::StatusOr<nlohmann::json> MiniCluster::WaitForSummary(absl::Duration timeout) {
  if (!scheduler_->WaitForStop(timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the job did not finish within ", absl::FormatDuration(timeout), "; worker clocks: ",
                     absl::StrJoin(scheduler_->coordinator().clocks(), ",")));
  }
  return scheduler_->coordinator().summary();
}

tessera::v1::JobSpec TestJob(tessera::v1::ConsistencySpec::Mode mode, int servers, int workers) {
  tessera::v1::JobSpec job;
  job.set_name("test");
  job.mutable_model()->mutable_mlp()->add_hidden_sizes(16);
  auto* data = job.mutable_data();
  data->set_format(tessera::v1::DataSpec::SYNTHETIC);
  data->set_synthetic_train_examples(2048);
  data->set_synthetic_test_examples(256);
  data->set_synthetic_features(32);
  data->set_synthetic_classes(4);
  job.mutable_optimizer()->set_kind(tessera::v1::OptimizerSpec::SGD);
  job.mutable_optimizer()->set_learning_rate(0.1f);
  job.set_batch_size(8);
  job.mutable_consistency()->set_mode(mode);
  job.mutable_stop()->set_max_steps(20);
  job.set_eval_every_steps(10);
  job.set_seed(5);
  job.set_chunk_bytes(256);
  job.mutable_cluster()->set_num_servers(servers);
  job.mutable_cluster()->set_num_workers(workers);
  ApplyJobDefaults(job);
  return job;
}

void ActAs(const PsClient& client, grpc::ClientContext& context) {
  context.AddMetadata(kMemberKeyHeader, client.member_key());
}

}  // namespace tessera::testing

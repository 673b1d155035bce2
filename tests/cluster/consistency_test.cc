// The consistency guarantees of DESIGN.md, each against real gRPC in an in-process cluster.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/rpc/grpc_status.h"
#include "common/model/job_spec.h"
#include "common/model/param_init.h"
#include "common/rpc/rpc.h"
#include "common/base/tensor_codec.h"
#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"
#include "worker/backend/cpu_backend.h"
#include "worker/models/mlp.h"
#include "worker/param_file.h"
#include "worker/parameter_source.h"
#include "worker/trainer.h"
#include "worker/worker.h"
#include "tests/testing/param_printers.h"

namespace tessera::testing {
namespace {

using tessera::v1::ConsistencySpec;

std::string TempPath(const std::string& name) {
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(test.begin(), test.end(), '/', '_');
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + "-" + test)).string();
}

// Trains `job` in one process with `batch` examples per step; returns the final parameters.
NamedTensors TrainLocally(tessera::v1::JobSpec job, int batch) {
  job.set_batch_size(batch);
  job.mutable_cluster()->set_num_workers(1);
  auto source = LocalSource::Create(job, "");
  EXPECT_THAT(source, IsOk());
  CpuBackend backend;
  TrainerOptions options;
  options.dump_params = TempPath("local.params");
  Trainer trainer(source->get(), &backend, options);
  EXPECT_THAT(trainer.Run(), IsOk());
  absl::StatusOr<NamedTensors> params = ReadParamFile(options.dump_params);
  EXPECT_THAT(params, IsOk());
  std::remove(options.dump_params.c_str());
  return *params;
}

class SyncEquivalenceTest : public ::testing::TestWithParam<tessera::v1::OptimizerSpec::Kind> {};

// Two workers on fixed batches (each the half of a global batch) give the parameters one process gets on the
// union of their batches: the sync round applies the batch-weighted mean of the two gradients, once.
TEST_P(SyncEquivalenceTest, TwoWorkersMatchOneProcessOnTheUnionOfTheirBatches) {
  tessera::v1::JobSpec job = TestJob(ConsistencySpec::SYNC, /*servers=*/2, /*workers=*/2);
  job.mutable_optimizer()->set_kind(GetParam());
  if (GetParam() == tessera::v1::OptimizerSpec::ADAM) {
    job.mutable_optimizer()->set_learning_rate(0.01f);
  } else {
    job.mutable_optimizer()->set_momentum(0.9f);
  }
  ApplyJobDefaults(job);
  ASSERT_THAT(ValidateJobSpec(job), IsOk());
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());

  const std::string dump = TempPath("sync.params");
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < 2; ++i) {
    WorkerOptions options;
    options.scheduler_address = (*cluster)->scheduler_address();
    options.device = "cpu";
    options.clock_wait_timeout_ms = 60000;
    options.trainer.dump_params = dump;  // only worker 0 writes it
    auto worker = Worker::Start(options);
    ASSERT_THAT(worker, IsOk());
    workers.push_back(std::move(*worker));
  }
  for (auto& worker : workers) {
    absl::StatusOr<TrainerResult> result = worker->Wait();
    ASSERT_THAT(result, IsOk());
    EXPECT_EQ(result->steps, 20);
  }
  absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ((*summary)["updates_applied"], 20);
  EXPECT_EQ((*summary)["max_staleness"], 0);
  const nlohmann::json status = (*cluster)->scheduler().coordinator().StatusJson();
  for (const auto& member : status["workers"]) {
    EXPECT_EQ(member["device"], "cpu") << "workers report the backend they compute on";
  }

  absl::StatusOr<NamedTensors> distributed = ReadParamFile(dump);
  ASSERT_THAT(distributed, IsOk());
  std::remove(dump.c_str());
  const NamedTensors local = TrainLocally(job, 2 * job.batch_size());
  absl::StatusOr<double> error = RelativeError(*distributed, local);
  ASSERT_THAT(error, IsOk());
  EXPECT_LT(*error, 1e-5) << "||sync - local|| / ||local|| after 20 steps";

  // The comparison is not vacuous: training moved the parameters well away from where they started.
  CpuBackend backend;
  auto model = Mlp::Create(&backend, Mlp::LayerSizes(job.model(), 32, 4), job.seed(), 8);
  ASSERT_THAT(model, IsOk());
  NamedTensors initial;
  for (const auto& p : (*model)->parameters()) {
    std::vector<float> values(NumElements(p.shape()));
    FillInit(p.init(), p.name(), 0, absl::MakeSpan(values));
    initial[p.name()] = values;
  }
  absl::StatusOr<double> moved = RelativeError(initial, local);
  ASSERT_THAT(moved, IsOk());
  EXPECT_GT(*moved, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SyncEquivalenceTest,
                         ::testing::Values(tessera::v1::OptimizerSpec::SGD, tessera::v1::OptimizerSpec::ADAM),
                         [](const auto& info) { return tessera::v1::OptimizerSpec::Kind_Name(info.param); });

// Four clients push known gradients concurrently, straight over gRPC, and send some pushes twice (one retry
// after the answer, one racing the original) with the same worker id and seq. With SGD (lr 1, no momentum) the
// result is order-independent, and the values are exact in float: nothing lost, nothing applied twice.
TEST(AsyncConsistencyTest, ConcurrentPushesWithRetriesAreAppliedExactlyOnce) {
  tessera::v1::JobSpec job = TestJob(ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/4);
  job.mutable_optimizer()->set_learning_rate(1.0f);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  constexpr int kWorkers = 4, kSteps = 25, kSize = 300;
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < kWorkers; ++w) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    ASSERT_THAT((*client)->Declare({FloatParam("w", kSize)}), IsOk());
    clients.push_back(std::move(*client));
  }
  // The newest view (each registration after placement is one).
  const tessera::v1::ShardMap map = *clients.back()->shard_map();
  ASSERT_GT(map.chunks_size(), 1);
  std::atomic<int> retries{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      const int id = clients[w]->worker_id();
      std::map<int, std::unique_ptr<tessera::v1::ParameterServer::Stub>> stubs;
      for (const auto& s : map.servers()) stubs[s.id()] = tessera::v1::ParameterServer::NewStub(MakeChannel(s.address(), *Security::Plaintext()));
      for (int k = 0; k < kSteps; ++k) {
        for (const auto& chunk : map.chunks()) {
          tessera::v1::PushRequest request;
          request.set_epoch(map.epoch());
          request.set_worker_id(id);
          request.set_incarnation(clients[w]->incarnation());
          request.set_seq(k + 1);
          request.set_clock(k);
          request.set_read_clock_version(k);
          request.set_batch_size(1);
          request.mutable_key()->set_param(chunk.param());
          request.mutable_key()->set_index(chunk.index());
          std::vector<float> g(chunk.length(), static_cast<float>((w + 1) * (k + 1)) / 1024.0f);
          EncodeFloats(g, request.mutable_data());
          const int copies = k % 3 == 0 ? 2 : 1;  // every third push is retried
          std::vector<std::thread> racers;
          for (int c = 0; c < copies; ++c) {
            racers.emplace_back([&, c] {
              grpc::ClientContext context;
              SetTimeout(context, absl::Seconds(30));
              ActAs(*clients[w], context);
              tessera::v1::PushResponse response;
              EXPECT_THAT(FromGrpcStatus(stubs[chunk.server_id()]->Push(&context, request, &response), context, "push"),
                          IsOk());
              if (c == 1) ++retries;
            });
            if (k % 6 == 0) racers.back().join();  // half the retries come after the first answer
          }
          for (auto& r : racers) {
            if (r.joinable()) r.join();
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_GT(retries.load(), 0);

  float expected = 0;
  for (int w = 0; w < kWorkers; ++w) {
    for (int k = 0; k < kSteps; ++k) expected -= static_cast<float>((w + 1) * (k + 1)) / 1024.0f;
  }
  std::vector<float> values(kSize);
  ASSERT_THAT(clients[0]->Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  for (int i = 0; i < kSize; ++i) ASSERT_EQ(values[i], expected) << "element " << i;
  int64_t duplicates = 0, updates = 0;
  for (int s = 0; s < (*cluster)->num_servers(); ++s) {
    duplicates += (*cluster)->server(s).store().Stats().duplicate_pushes();
    updates += (*cluster)->server(s).store().Stats().updates_applied();
  }
  EXPECT_EQ(duplicates, retries.load());
  EXPECT_EQ(updates, static_cast<int64_t>(kWorkers) * kSteps * map.chunks_size());
}

struct StalenessCase {
  ConsistencySpec::Mode mode;
  int bound;
};

void PrintTo(const StalenessCase& c, std::ostream* os) {
  *os << ConsistencySpec::Mode_Name(c.mode);
  if (c.mode == ConsistencySpec::SSP) *os << " staleness " << c.bound;
}

class StalenessBoundTest : public ::testing::TestWithParam<StalenessCase> {};

// One worker is slowed on purpose. Under SSP(s) the fast one is never more than s clocks ahead of it, and the
// largest staleness the run reports is at most s; under ASYNC the fast worker runs away and staleness exceeds 3.
TEST_P(StalenessBoundTest, FastWorkerStaysWithinTheBound) {
  const StalenessCase param = GetParam();
  tessera::v1::JobSpec job = TestJob(param.mode, /*servers=*/2, /*workers=*/2);
  if (param.mode == ConsistencySpec::SSP) job.mutable_consistency()->set_staleness(param.bound);
  ASSERT_THAT(ValidateJobSpec(job), IsOk());
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  constexpr int kSteps = 12;
  std::atomic<int64_t> slow_clock{0};
  std::atomic<int64_t> max_gap{0};

  auto run = [&](bool slow) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    PsClient& c = **client;
    ASSERT_THAT(c.Declare({FloatParam("w", 200)}), IsOk());
    std::vector<float> values(200), grad(200, 0.001f);
    for (int step = 0; step < kSteps; ++step) {
      if (!slow) max_gap = std::max<int64_t>(max_gap, c.clock() - slow_clock.load());
      ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
      // The straggler's extra compute time (the injected slowdown), not a synchronisation.
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(60));
      ASSERT_THAT(c.Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
      // Published before the scheduler hears of it, so the fast worker never sees a gap smaller than the truth.
      if (slow) slow_clock = c.clock() + 1;
      ASSERT_THAT(c.Clock(), IsOk());
    }
    ASSERT_THAT(c.Done(), IsOk());
  };
  std::thread slow_thread(run, true);
  std::thread fast_thread(run, false);
  slow_thread.join();
  fast_thread.join();

  absl::StatusOr<nlohmann::json> summary = (*cluster)->WaitForSummary(absl::Seconds(30));
  ASSERT_THAT(summary, IsOk());
  const int64_t max_staleness = (*summary)["max_staleness"];
  if (param.mode == ConsistencySpec::SSP) {
    EXPECT_LE(max_gap.load(), param.bound) << "fast worker ran ahead of the slow one";
    EXPECT_LE(max_staleness, param.bound);
  } else {
    EXPECT_GT(max_gap.load(), 3);
    EXPECT_GT(max_staleness, 3) << "async with a straggler must show staleness above 3";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, StalenessBoundTest,
                         ::testing::Values(StalenessCase{ConsistencySpec::SSP, 0}, StalenessCase{ConsistencySpec::SSP, 1},
                                           StalenessCase{ConsistencySpec::SSP, 3},
                                           StalenessCase{ConsistencySpec::ASYNC, -1}),
                         [](const auto& info) {
                           return info.param.mode == ConsistencySpec::ASYNC ? std::string("Async")
                                                                            : "Ssp" + std::to_string(info.param.bound);
                         });

}  // namespace
}  // namespace tessera::testing

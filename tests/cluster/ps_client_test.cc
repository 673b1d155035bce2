// The client library against a real in-process cluster.
#include <cmath>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/security.h"
#include "common/base/thread_pool.h"
#include "common/model/wire_format.h"
#include "worker/client/chunk_calls.h"
#include "worker/client/grpc_chunk_transport.h"
#include "worker/client/ucx_chunk_transport.h"

#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/param_printers.h"

namespace tessera::testing {
namespace {

// A call's key names a dense chunk by its parameter and index; a call for an embedding table's rows, which has no
// chunk placement, by its table and server.
TEST(PsClientTest, ACallsKeyNamesItsChunkOrItsTableAndServer) {
  tessera::v1::ChunkPlacement placement;
  placement.set_param("w");
  placement.set_index(2);
  ChunkCall dense;
  dense.op = kPush;
  dense.placement = &placement;
  EXPECT_EQ(dense.key(), std::make_pair(std::string("w"), 2));
  ChunkCall rows;
  rows.op = kRowPull;
  rows.server_id = 3;
  rows.row_pull().set_table("emb");
  EXPECT_EQ(rows.key(), std::make_pair(std::string("emb"), 3));
  rows.op = kRowPush;
  rows.row_push().set_table("clicks");
  EXPECT_EQ(rows.key(), std::make_pair(std::string("clicks"), 3));
}

TEST(PsClientTest, UnchangedChunksArePulledWithoutBytes) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  PsClient& c = **client;
  tessera::v1::ParameterSpec p;
  p.set_name("w");
  p.set_dtype(tessera::v1::DT_FLOAT32);
  p.add_shape(1000);
  p.mutable_init()->set_kind(tessera::v1::InitSpec::UNIFORM);
  p.mutable_init()->set_scale(1.0f);
  ASSERT_THAT(c.Declare({p}), IsOk());
  ASSERT_GT(c.shard_map()->chunks_size(), 1);

  std::vector<float> values(1000), other(1000);
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 4000);
  const std::vector<float> first = values;
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 4000) << "nothing changed and the memory holds it: nothing should travel";
  EXPECT_EQ(values, first);

  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(other)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 8000) << "other memory does not hold the values: every byte travels";
  EXPECT_EQ(other, first);
  c.ForgetPulledValues();
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(other)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 12000);

  std::vector<float> grad(1000, 1.0f);
  ASSERT_THAT(c.Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
  ASSERT_THAT(c.Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  EXPECT_EQ(c.bytes_pulled(), 16000) << "a pull after a push always moves bytes";
  EXPECT_FLOAT_EQ(values[0], first[0] - 0.1f);  // TestJob: SGD, lr 0.1
}

TEST(PsClientTest, PushPullReturnsTheValuesAfterTheUpdate) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 500)}), IsOk());  // zeros, chunks on both servers
  std::vector<float> grad(500, 2.0f), values(500, 7.0f);
  ASSERT_THAT((*client)->PushPull({"w"}, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(values)}), IsOk());
  for (float v : values) ASSERT_FLOAT_EQ(v, -0.2f);  // 0 - lr 0.1 * 2
}

// Two workers of a SYNC job each run steps whose gradients are sent parameter by parameter, last first (as
// backward produces them). Every exchange is answered once the round closed, with the same values for both.
TEST(PsClientTest, SyncStepExchangeAnswersBothWorkersWithTheClosedRoundsValues) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::SYNC, /*servers=*/2, /*workers=*/2));
  ASSERT_THAT(cluster, IsOk());
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int i = 0; i < 2; ++i) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    clients.push_back(std::move(*client));
  }
  const std::vector<std::string> names = {"a", "b"};
  std::vector<std::vector<float>> values(2, std::vector<float>(300 + 200));
  std::vector<absl::Status> errors(2);
  auto run = [&](int w) {
    PsClient& c = *clients[w];
    absl::Status declared = c.Declare({FloatParam("a", 300), FloatParam("b", 200)});
    if (!declared.ok()) {
      errors[w] = declared;
      return;
    }
    std::vector<float> ga(300, 1.0f + w), gb(200, 3.0f * (w + 1)), a(300), b(200);
    for (int step = 0; step < 3; ++step) {
      auto exchange = c.BeginStep(names, {absl::MakeConstSpan(ga), absl::MakeConstSpan(gb)}, /*batch_size=*/1,
                                  {absl::MakeSpan(a), absl::MakeSpan(b)});
      absl::Status sent = exchange->Send(1);  // "b" first, then "a"
      if (sent.ok()) sent = exchange->Send(0);
      absl::StatusOr<ClockResult> clock = sent.ok() ? exchange->Finish() : absl::StatusOr<ClockResult>(sent);
      if (clock.ok()) {
        // The values arrive after the clock; the first layer's are asked for first.
        absl::Status in = exchange->WaitValues(0);
        if (in.ok()) in = exchange->WaitValues(1);
        if (!in.ok()) clock = in;
      }
      if (!clock.ok()) {
        errors[w] = clock.status();
        return;
      }
      if (clock->clock != step + 1) errors[w] = absl::InternalError("clock did not advance by one");
    }
    std::copy(a.begin(), a.end(), values[w].begin());
    std::copy(b.begin(), b.end(), values[w].begin() + 300);
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  ASSERT_THAT(errors[0], IsOk());
  ASSERT_THAT(errors[1], IsOk());
  EXPECT_EQ(values[0], values[1]) << "both workers get the same closed rounds";
  // Three rounds of SGD (lr 0.1, no momentum) with the mean gradients 1.5 ("a") and 4.5 ("b").
  EXPECT_NEAR(values[0][0], -0.45f, 1e-5);
  EXPECT_NEAR(values[0][300], -1.35f, 1e-5);
  auto stats = (*cluster)->server(0).store().Stats();
  EXPECT_EQ(stats.duplicate_pushes(), 0);
  EXPECT_EQ(stats.late_pushes(), 0);
}

TEST(PsClientTest, StepExchangeRejectsANonFiniteGradientBeforeSendingIt) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("a", 300)}), IsOk());
  const std::vector<std::string> names = {"a"};
  std::vector<float> grad(300, 1.0f), out(300);
  grad[299] = std::numeric_limits<float>::infinity();
  auto exchange = (*client)->BeginStep(names, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(out)});
  EXPECT_THAT(exchange->Send(0), StatusIs(absl::StatusCode::kInvalidArgument, "index 299"));
  exchange.reset();
  std::vector<float> values(300, 5.0f);
  ASSERT_THAT((*client)->Pull(names, {absl::MakeSpan(values)}), IsOk());
  for (float v : values) ASSERT_EQ(v, 0.0f) << "nothing of the bad gradient reached a server";
}

// A gradient announced in parts (backward producing a weight's gradient a block of rows at a time): the chunks
// wholly within a part leave at once, before the rest is final, and the values end as if it had been sent
// whole; a non-finite value found in a later part is refused, naming its index in the whole gradient, and none
// of that part's chunks leaves.
TEST(PsClientTest, AGradientSentInPartsLeavesChunkByChunkAndRefusesANonFinitePart) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("a", 300)}), IsOk());  // zeros; chunks of at most 64 values
  // Where the chunks that lie wholly within the first `values` values end.
  auto chunks_within = [&](size_t values) {
    size_t end = 0;
    for (const auto& c : (*client)->shard_map()->chunks()) {
      const auto chunk_end = static_cast<size_t>(c.offset() + c.length());
      if (chunk_end <= values) end = std::max(end, chunk_end);
    }
    return end;
  };
  const size_t first = chunks_within(150);
  ASSERT_GT(first, 0u);
  ASSERT_LT(first, 150u);  // the chunk across 150 is not final yet
  const std::vector<std::string> names = {"a"};
  std::vector<float> grad(300, 1.0f), out(300), seen(300);
  auto exchange = (*client)->BeginStep(names, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(out)});
  ASSERT_THAT(exchange->SendPart(0, 150), IsOk());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    ASSERT_THAT((*client)->Pull(names, {absl::MakeSpan(seen)}), IsOk());
  } while (std::count(seen.begin(), seen.begin() + first, 0.0f) > 0 && absl::Now() < deadline);
  for (size_t i = 0; i < first; ++i) ASSERT_FLOAT_EQ(seen[i], -0.1f) << "index " << i;  // TestJob: SGD, lr 0.1
  for (size_t i = first; i < 300; ++i) ASSERT_EQ(seen[i], 0.0f) << "index " << i << " left before it was final";
  ASSERT_THAT(exchange->Send(0), IsOk());
  ASSERT_THAT(exchange->Finish(), IsOk());
  ASSERT_THAT(exchange->WaitValues(0), IsOk());
  for (int i = 0; i < 300; ++i) ASSERT_FLOAT_EQ(out[i], -0.1f) << "index " << i;

  // The next step finds an infinity in its second part: that part is refused and none of its chunks leaves.
  const size_t sent = chunks_within(100);
  std::fill(grad.begin(), grad.end(), 1.0f);
  grad[200] = std::numeric_limits<float>::infinity();
  exchange = (*client)->BeginStep(names, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(out)});
  ASSERT_THAT(exchange->SendPart(0, 100), IsOk());
  do {
    ASSERT_THAT((*client)->Pull(names, {absl::MakeSpan(seen)}), IsOk());
  } while (std::count(seen.begin(), seen.begin() + sent, -0.1f) > 0 && absl::Now() < deadline);
  EXPECT_THAT(exchange->SendPart(0, 256), StatusIs(absl::StatusCode::kInvalidArgument, "index 200"));
  exchange.reset();
  ASSERT_THAT((*client)->Pull(names, {absl::MakeSpan(seen)}), IsOk());
  for (size_t i = 0; i < sent; ++i) ASSERT_FLOAT_EQ(seen[i], -0.2f) << "index " << i;
  for (size_t i = sent; i < 300; ++i) ASSERT_FLOAT_EQ(seen[i], -0.1f) << "index " << i << " changed by a refused part";
}

// Many exchanges in flight at once from several clients, each into its own memory: every client reads back
// exactly the values after its own push (ASYNC, one worker id each), so no reply buffer is shared wrongly.
TEST(PsClientTest, ConcurrentExchangesFromSeveralWorkersNeverMixTheirReplies) {
  auto job = TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/4);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int i = 0; i < 4; ++i) {
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    clients.push_back(std::move(*client));
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(4);
  std::atomic<int64_t> pushes{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      PsClient& c = *clients[w];
      // Each worker owns one parameter, so the values after its push are known exactly.
      const std::string name = absl::StrCat("p", w);
      std::vector<tessera::v1::ParameterSpec> all;
      for (int k = 0; k < 4; ++k) all.push_back(FloatParam(absl::StrCat("p", k), 1000));
      if (auto s = c.Declare(all); !s.ok()) {
        errors[w] = s;
        return;
      }
      std::vector<float> grad(1000, 1.0f), out(1000);
      for (int step = 1; step <= 20; ++step) {
        if (auto s = c.PushPull({name}, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(out)}); !s.ok()) {
          errors[w] = s;
          return;
        }
        ++pushes;
        for (float v : out) {
          if (std::abs(v - (-0.1f * step)) > 1e-4f) {
            errors[w] = absl::InternalError(absl::StrCat("worker ", w, " step ", step, " read ", v));
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_THAT(e, IsOk());
  EXPECT_EQ(pushes.load(), 80);
}

// A client whose options are wrong fails before it registers: it takes no worker's place in the job.
TEST(PsClientTest, AnUnknownTransportFailsBeforeRegistering) {
  auto cluster = MiniCluster::Start(TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/1, /*workers=*/1));
  ASSERT_THAT(cluster, IsOk());
  PsClient::Options options;
  options.scheduler_address = (*cluster)->scheduler_address();
  options.heartbeat = false;
  options.transport = "rdma";
  EXPECT_THAT(PsClient::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, "expected grpc or ucx"));
  options.transport = "";
  options.fabric_spin_us = -5;
  EXPECT_THAT(PsClient::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, "--fabric_spin_us"));
  auto client = (*cluster)->ConnectClient();  // the job's one worker slot is still free
  ASSERT_THAT(client, IsOk());
  EXPECT_EQ((*client)->worker_id(), 0);
}

// The real gRPC transport, recording the order in which calls start.
class RecordingTransport final : public ChunkTransport {
 public:
  const char* name() const override { return "grpc"; }
  absl::Status Prepare(ChunkCall& call, const CallerIdentity& who) override { return grpc_.Prepare(call, who); }
  void Start(ChunkCall* call, std::function<void()> done) override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = started_.empty();
      started_.push_back(call->key());
    }
    if (!first) {
      grpc_.Start(call, std::move(done));
      return;
    }
    // The first call completes only once the test has added every call.
    grpc_.Start(call, [this, done = std::move(done)] {
      release_.WaitForNotification();
      done();
    });
  }
  void Cancel(ChunkCall* call) override { grpc_.Cancel(call); }

  void Release() { release_.Notify(); }
  std::vector<std::pair<std::string, int>> started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }

 private:
  GrpcChunkTransport grpc_{Security::Plaintext(), 1};
  absl::Notification release_;
  absl::Mutex mu_;
  std::vector<std::pair<std::string, int>> started_ ABSL_GUARDED_BY(mu_);
};

// Backward sends the last layer first and the first layer last, but the next forward pass needs the first layer
// first: at a busy server (here a window of one call), the first layer's pieces, sent last, overtake the last
// layer's that still wait.
TEST(PsClientTest, TheFirstLayersPiecesOvertakeTheLastLayersOnTheWire) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/1, /*workers=*/1);
  auto cluster = MiniCluster::Start(job);  // chunk_bytes 256: 64 values a piece
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("layer0", 640), FloatParam("layer2", 640)}), IsOk());
  auto map = std::make_shared<const ShardMapIndex>(*(*client)->shard_map());
  auto recorder = std::make_unique<RecordingTransport>();
  RecordingTransport* recording = recorder.get();
  ChunkCaller caller(std::move(recorder));
  const CallerIdentity who{(*client)->worker_id(), (*client)->incarnation(), (*client)->member_key()};
  const std::vector<float> grad(640, 1.0f);
  SerialExecutor launcher;
  {
    ChunkBatch batch(/*window=*/1, &launcher);
    uint64_t seq = 1;
    for (auto [name, index] : {std::pair<std::string, size_t>{"layer2", 2}, {"layer0", 0}}) {  // backward's order
      auto calls = caller.Make(kPush, map, index, name, grad, 1, {}, Stamp{seq++, 0}, who, {}, absl::Seconds(10));
      ASSERT_THAT(calls, IsOk());
      ASSERT_EQ(calls->size(), 10u);
      for (auto& c : *calls) batch.Add(std::move(c));
    }
    recording->Release();
    batch.WaitAll();
    for (ChunkCall* c : batch.calls()) ASSERT_THAT(c->status, IsOk());
  }
  const auto started = recording->started();
  ASSERT_EQ(started.size(), 20u);
  EXPECT_EQ(started[0], std::make_pair(std::string("layer2"), 0)) << "the server was idle: it went at once";
  for (int i = 1; i <= 10; ++i) EXPECT_EQ(started[i].first, "layer0") << i;
  for (int i = 11; i < 20; ++i) EXPECT_EQ(started[i].first, "layer2") << i;
}

// A step whose exchanges were still waiting for the launcher when it was cancelled (the job stopped) ends at
// once: none of them starts, where each would wait for a SYNC round that never closes (here the other worker
// never pushes) until its deadline. Over UCX a transport does not know a call it has not started.
class CancelTest : public ::testing::TestWithParam<tessera::v1::Transport> {};

TEST_P(CancelTest, ACancelledBatchStartsNoneOfTheCallsStillWaitingToLaunch) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::SYNC, /*servers=*/1, /*workers=*/2);
  job.set_transport(GetParam());
  job.set_trusted_network(true);
  auto cluster = MiniCluster::Start(job);
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 640)}), IsOk());
  auto map = std::make_shared<const ShardMapIndex>(*(*client)->shard_map());
  absl::StatusOr<std::unique_ptr<UcxChunkTransport>> ucx;
  std::unique_ptr<ChunkTransport> transport;
  const CallerIdentity who{(*client)->worker_id(), (*client)->incarnation(), (*client)->member_key()};
  if (GetParam() == tessera::v1::UCX) {
    ucx = UcxChunkTransport::Start(Security::Plaintext(), who);
    ASSERT_THAT(ucx, IsOk());
    transport = *std::move(ucx);
  } else {
    transport = std::make_unique<GrpcChunkTransport>(Security::Plaintext(), 1);
  }
  ChunkCaller caller(std::move(transport));
  const std::vector<float> grad(640, 1.0f);
  std::vector<float> out(640);
  SerialExecutor launcher;
  absl::Notification release;
  launcher.Submit([&] { release.WaitForNotification(); });  // the launcher is busy
  const absl::Time start = absl::Now();
  {
    ChunkBatch batch(/*window=*/8, &launcher);
    auto calls = caller.Make(kExchange, map, 0, "w", grad, 1, absl::MakeSpan(out), Stamp{1, 0}, who, {},
                             absl::Seconds(60));
    ASSERT_THAT(calls, IsOk());
    for (auto& c : *calls) batch.Add(std::move(c));
    batch.CancelAll();
    release.Notify();
    batch.WaitAll();
    for (ChunkCall* c : batch.calls()) EXPECT_THAT(c->status, StatusIs(absl::StatusCode::kCancelled, "cancelled")) << c->What();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "a cancelled call started and waited for its round";
}

INSTANTIATE_TEST_SUITE_P(Transports, CancelTest, ::testing::Values(tessera::v1::GRPC, tessera::v1::UCX),
                         [](const auto& info) { return tessera::v1::Transport_Name(info.param); });

// A job with a 16-bit wire, over each transport: gradients pushed in 16 bits reach the server with nothing lost
// (error feedback carries each rounding into the next push, so the server's float32 values end where float32
// gradients would have taken them, to within one rounding), and values come back in half the bytes.
class WireTest : public ::testing::TestWithParam<std::tuple<tessera::v1::Transport, WirePrecision>> {
 protected:
  tessera::v1::JobSpec Job(WirePrecision values) const {
    tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1);
    job.set_transport(std::get<0>(GetParam()));
    job.set_trusted_network(true);
    job.mutable_wire()->set_gradients(std::get<1>(GetParam()));
    job.mutable_wire()->set_values(values);
    return job;
  }
};

TEST_P(WireTest, GradientsLoseNothingAndValuesTakeHalfTheBytes) {
  constexpr int kValues = 1000, kPushes = 50;
  constexpr float kLr = 0.1f;  // TestJob's SGD
  std::vector<float> grad(kValues);
  // Values no 16-bit format holds exactly: without error feedback each push would lose up to 2^-9 of itself.
  for (int i = 0; i < kValues; ++i) grad[i] = 1e-3f * (1.0f + static_cast<float>(i) / 997.0f) + 1e-7f * (i % 13);
  {
    auto cluster = MiniCluster::Start(Job(tessera::v1::WireSpec::FP32));
    ASSERT_THAT(cluster, IsOk());
    auto client = (*cluster)->ConnectClient();
    ASSERT_THAT(client, IsOk());
    ASSERT_THAT((*client)->Declare({FloatParam("w", kValues)}), IsOk());  // zeros, on both servers
    for (int t = 0; t < kPushes; ++t) ASSERT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
    std::vector<float> values(kValues);
    ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
    EXPECT_EQ((*client)->bytes_pulled(), 4 * kValues);
    double worst = 0;
    for (int i = 0; i < kValues; ++i) {
      worst = std::max(worst, std::fabs(values[i] + static_cast<double>(kLr) * kPushes * grad[i]));
    }
    // What is still owed is one rounding: at most 2^-8 of a gradient below 2e-3 in BF16, times the learning
    // rate, 8e-7. Fifty roundings lost would be up to 4e-5.
    EXPECT_LT(worst, 1e-6) << "the server's values drifted from the float32 gradients' sum";
  }
  auto cluster = MiniCluster::Start(Job(std::get<1>(GetParam())));
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", kValues)}), IsOk());
  std::vector<float> values(kValues), again(kValues);
  ASSERT_THAT((*client)->PushPull({"w"}, {absl::MakeConstSpan(grad)}, 1, {absl::MakeSpan(values)}), IsOk());
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(again)}), IsOk());
  EXPECT_EQ((*client)->bytes_pulled(), 2 * 2 * kValues) << "an exchange and a pull, 2 bytes a value";
  for (int i = 0; i < kValues; ++i) {
    ASSERT_NEAR(values[i], -kLr * grad[i], kLr * grad[i] / 128) << i;
    ASSERT_EQ(values[i], again[i]) << i;
  }
}

// Top-k over a parameter whose last chunk holds one value (a chunk too small for top-k goes dense): every push
// is taken, and what top-k held back arrives later, so after 50 equal pushes every value is where 50 float32
// pushes would have taken it, but for what the residual still owes (at most about 1 / top_k pushes' worth).
TEST(PsClientTest, TopKPushesOfEveryChunkSizeArriveAndLoseNothing) {
  tessera::v1::JobSpec job = TestJob(tessera::v1::ConsistencySpec::ASYNC, /*servers=*/2, /*workers=*/1);
  job.mutable_wire()->set_gradients(tessera::v1::WireSpec::BF16);
  job.mutable_wire()->set_gradient_top_k(0.1f);
  auto cluster = MiniCluster::Start(job);  // chunk_bytes 256: 64 values a chunk, so 641 values end in a chunk of 1
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 641)}), IsOk());
  constexpr int kPushes = 50;
  constexpr float kLr = 0.1f, kGrad = 0.01f;
  const std::vector<float> grad(641, kGrad);
  for (int t = 0; t < kPushes; ++t) ASSERT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk()) << t;
  std::vector<float> values(641);
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(values)}), IsOk());
  for (int i = 0; i < 641; ++i) {
    // Owed at most ~1/top_k = 10 pushes' worth (plus one of rounding slack).
    ASSERT_NEAR(values[i], -kLr * kPushes * kGrad, kLr * 11 * kGrad) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    TransportsAndPrecisions, WireTest,
    ::testing::Combine(::testing::Values(tessera::v1::GRPC, tessera::v1::UCX),
                       ::testing::Values(tessera::v1::WireSpec::BF16, tessera::v1::WireSpec::FP16)),
    [](const auto& info) {
      return absl::StrCat(tessera::v1::Transport_Name(std::get<0>(info.param)), "_",
                          PrecisionName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace tessera::testing

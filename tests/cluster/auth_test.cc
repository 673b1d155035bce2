// Authentication and encryption over real gRPC and HTTP: the job token on every RPC, TLS and mutual TLS with
// certificates made by OpenSSL for the test, HTTPS with POST behind the token, and no plaintext beyond loopback
// unless asked for.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/daemon/http_endpoint.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "common/base/tensor_codec.h"
#include "deploy/launcher/credentials.h"
#include "gtest/gtest.h"
#include "tests/cluster/mini_cluster.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/status_matchers.h"
#include "worker/client/chunk_calls.h"
#include "worker/client/ucx_chunk_transport.h"

namespace tessera::testing {
namespace {

using tessera::v1::ConsistencySpec;

constexpr char kToken[] = "tessera-test-token-0123456789abcdef";

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/auth-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    std::filesystem::permissions(token_file_, std::filesystem::perms::owner_read);
  }

  // A CA of its own and a certificate for 127.0.0.1 it signed, valid for `days`.
  CertificatePaths Certificates(const std::string& name, int days = 30) {
    absl::StatusOr<CertificatePaths> ca = MakeCertificateAuthority(dir_, name);
    EXPECT_THAT(ca, IsOk());
    CertificatePaths signed_by;
    EXPECT_THAT(SignCertificate(*ca, dir_, name + "-node", {"127.0.0.1", "localhost"}, days, &signed_by), IsOk());
    return signed_by;
  }

  SecurityOptions Tls(const CertificatePaths& paths, bool with_ca = true) const {
    SecurityOptions options;
    options.token_file = token_file_;
    options.tls_cert = paths.cert;
    options.tls_key = paths.key;
    if (with_ca) options.tls_ca = paths.ca;
    return options;
  }

  std::unique_ptr<MiniCluster> Start(const SecurityOptions& security, int workers = 1) {
    auto cluster = MiniCluster::Start(TestJob(ConsistencySpec::ASYNC, 2, workers), absl::Minutes(5), security);
    EXPECT_THAT(cluster, IsOk());
    return cluster.ok() ? std::move(*cluster) : nullptr;
  }

  // A client that gives up after a second.
  absl::StatusOr<std::unique_ptr<PsClient>> Connect(MiniCluster& cluster, const SecurityOptions& security) {
    PsClient::Options options;
    options.scheduler_address = cluster.scheduler_address();
    options.heartbeat = false;
    options.connect_timeout = absl::Seconds(1);
    options.security = security;
    return PsClient::Connect(options);
  }

  std::string dir_;
  std::string token_file_;
};

TEST_F(AuthTest, EveryRpcRefusesAMissingOrWrongTokenAndChangesNothing) {
  SecurityOptions security;
  security.token_file = token_file_;
  std::unique_ptr<MiniCluster> cluster = Start(security, /*workers=*/2);
  ASSERT_NE(cluster, nullptr);
  auto client = cluster->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 64)}), IsOk());
  std::vector<float> before(64);
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(before)}), IsOk());
  const tessera::v1::ShardMap map = *(*client)->shard_map();
  auto scheduler = MakeChannel(cluster->scheduler_address(), *Security::Plaintext());
  auto server = MakeChannel(map.servers(map.chunks(0).server_id()).address(), *Security::Plaintext());

  // A valid request for every method: only the token is missing or wrong.
  tessera::v1::RegisterRequest reg;
  reg.set_role(tessera::v1::WORKER);
  tessera::v1::HeartbeatRequest beat;
  beat.set_role(tessera::v1::WORKER);
  tessera::v1::DeclareRequest declare;
  *declare.add_params() = FloatParam("other", 8);
  tessera::v1::AdvanceClockRequest clock;
  clock.set_clock(1);
  tessera::v1::ReportRequest report;
  report.set_has_eval(true);
  report.set_test_accuracy(1.0);
  tessera::v1::PushRequest push;
  push.set_epoch(map.epoch());
  push.set_incarnation((*client)->incarnation());
  push.set_seq(99);
  push.set_batch_size(1);
  push.mutable_key()->set_param("w");
  EncodeFloats(std::vector<float>(map.chunks(0).length(), 1.0f), push.mutable_data());
  tessera::v1::PullRequest pull;
  pull.set_epoch(map.epoch());
  pull.mutable_key()->set_param("w");
  tessera::v1::AssignShardsRequest assign;
  *assign.mutable_shard_map() = map;
  assign.mutable_shard_map()->set_epoch(map.epoch() + 1);
  *assign.mutable_job() = (*client)->job();
  tessera::v1::CheckpointRequest checkpoint;
  checkpoint.set_path(dir_ + "/forged.shard");
  const std::vector<std::tuple<std::shared_ptr<grpc::Channel>, std::string, const google::protobuf::Message*>> calls = {
      {scheduler, "/tessera.v1.Scheduler/Register", &reg},
      {scheduler, "/tessera.v1.Scheduler/Heartbeat", &beat},
      {scheduler, "/tessera.v1.Scheduler/Declare", &declare},
      {scheduler, "/tessera.v1.Scheduler/GetShardMap", &tessera::v1::GetShardMapRequest::default_instance()},
      {scheduler, "/tessera.v1.Scheduler/AdvanceClock", &clock},
      {scheduler, "/tessera.v1.Scheduler/Report", &report},
      {scheduler, "/tessera.v1.Scheduler/Done", &tessera::v1::DoneRequest::default_instance()},
      {server, "/tessera.v1.ParameterServer/Pull", &pull},
      {server, "/tessera.v1.ParameterServer/Push", &push},
      {server, "/tessera.v1.ParameterServer/PushPull", &push},
      {server, "/tessera.v1.ParameterServer/AssignShards", &assign},
      {server, "/tessera.v1.ParameterServer/Checkpoint", &checkpoint},
      {server, "/tessera.v1.ParameterServer/GetStats", &tessera::v1::ServerStatsRequest::default_instance()},
      {server, "/tessera.v1.ParameterServer/DecideRounds", &tessera::v1::DecideRoundsRequest::default_instance()},
      {server, "/tessera.v1.ParameterServer/Shutdown", &tessera::v1::ShutdownRequest::default_instance()}};
  for (const auto& [channel, method, request] : calls) {
    SCOPED_TRACE(method);
    // The worker's member key does not stand in for the token.
    const Metadata member = {{kMemberKeyHeader, (*client)->member_key()}};
    EXPECT_THAT(RawUnary(channel, method, *request, member), StatusIs(absl::StatusCode::kUnauthenticated, "token"));
    const Metadata wrong = {{kAuthorizationHeader, "Bearer tessera-test-token-0123456789abcdeX"},
                            {kMemberKeyHeader, (*client)->member_key()}};
    EXPECT_THAT(RawUnary(channel, method, *request, wrong),
                StatusIs(absl::StatusCode::kUnauthenticated, "wrong job token"));
  }
  // Nothing changed: no second worker registered, no parameter declared, the values and the job as they were.
  const std::vector<Member> workers = cluster->scheduler().coordinator().view().Workers();
  EXPECT_EQ(workers[1].state, MemberState::kVacant);
  EXPECT_EQ(cluster->scheduler().coordinator().GetShardMap()->params_size(), 1);
  EXPECT_FALSE(cluster->scheduler().coordinator().finished());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/forged.shard"));
  std::vector<float> after(64);
  (*client)->ForgetPulledValues();
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(after)}), IsOk());
  EXPECT_EQ(after, before);
  // The servers still serve the job (a Shutdown would have ended them).
  std::vector<float> grad(64, 1.0f);
  EXPECT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());
}

TEST_F(AuthTest, MutualTlsWithTheJobsCertificatesTrainsAndAWrongCaFailsTheHandshake) {
  const CertificatePaths job = Certificates("job");
  std::unique_ptr<MiniCluster> cluster = Start(Tls(job));
  ASSERT_NE(cluster, nullptr);
  auto client = Connect(*cluster, Tls(job));
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 64)}), IsOk());
  std::vector<float> grad(64, 1.0f);
  EXPECT_THAT((*client)->Push({"w"}, {absl::MakeConstSpan(grad)}, 1), IsOk());

  // A certificate (and CA) of another authority: neither side accepts the other.
  const CertificatePaths other = Certificates("other");
  EXPECT_THAT(Connect(*cluster, Tls(other)), StatusIs(absl::StatusCode::kUnavailable, ""));
  // The job's CA but no client certificate: mutual TLS refuses it.
  SecurityOptions no_cert;
  no_cert.token_file = token_file_;
  no_cert.tls_ca = job.ca;
  EXPECT_THAT(Connect(*cluster, no_cert), StatusIs(absl::StatusCode::kUnavailable, ""));
  // Plaintext to a TLS port.
  SecurityOptions plaintext;
  plaintext.token_file = token_file_;
  EXPECT_THAT(Connect(*cluster, plaintext), StatusIs(absl::StatusCode::kUnavailable, ""));
}

TEST_F(AuthTest, AnExpiredCertificateFailsTheHandshake) {
  const CertificatePaths job = Certificates("job");
  std::unique_ptr<MiniCluster> cluster = Start(Tls(job));
  ASSERT_NE(cluster, nullptr);
  CertificatePaths expired;
  // Same CA, a certificate whose validity ends the second it is made.
  CertificatePaths authority{job.ca, job.ca_key, "", ""};
  ASSERT_THAT(SignCertificate(authority, dir_, "expired", {"127.0.0.1"}, /*days=*/0, &expired), IsOk());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_THAT(Connect(*cluster, Tls(expired)), StatusIs(absl::StatusCode::kUnavailable, ""));
  EXPECT_THAT(Connect(*cluster, Tls(job)), IsOk());
}

TEST_F(AuthTest, HttpsServesReadsToAnyoneAndActionsOnlyWithTheToken) {
  const CertificatePaths job = Certificates("job");
  std::unique_ptr<MiniCluster> cluster = Start(Tls(job));
  ASSERT_NE(cluster, nullptr);
  httplib::SSLClient https("127.0.0.1", cluster->scheduler().http_port());
  https.set_ca_cert_path(job.ca.c_str());
  https.enable_server_certificate_verification(true);
  httplib::Result health = https.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = https.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  httplib::Result anonymous = https.Post("/checkpoint");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401);
  httplib::Result wrong = https.Post("/checkpoint", {{"Authorization", "Bearer nope"}}, "", "text/plain");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  httplib::Result allowed =
      https.Post("/checkpoint", {{"Authorization", absl::StrCat("Bearer ", kToken)}}, "", "text/plain");
  ASSERT_TRUE(allowed);
  // Past the token; the job has no checkpoint folder, which is a conflict with the request, not a success.
  EXPECT_EQ(allowed->status, 409);
  EXPECT_NE(allowed->body.find("no checkpoint"), std::string::npos) << allowed->body;
  // Plain HTTP to the HTTPS port gets nothing.
  httplib::Client plain("127.0.0.1", cluster->scheduler().http_port());
  httplib::Result refused = plain.Get("/healthz");
  EXPECT_TRUE(!refused || refused->status != 200);
}

TEST_F(AuthTest, PlaintextBeyondLoopbackNeedsInsecure) {
  tessera::v1::ParameterServer::CallbackService service;  // any service: gRPC serves none without one
  EXPECT_THAT(StartGrpcServer("0.0.0.0", 0, {&service}, *Security::Plaintext()),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--insecure"));
  EXPECT_THAT(HttpEndpoint::Start("0.0.0.0", 0, *Security::Plaintext(), {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--insecure"));
  SecurityOptions insecure;
  insecure.insecure = true;
  absl::StatusOr<std::shared_ptr<const Security>> allowed = Security::Load(insecure);
  ASSERT_THAT(allowed, IsOk());
  EXPECT_THAT(StartGrpcServer("0.0.0.0", 0, {&service}, **allowed), IsOk());
  // With TLS no flag is needed.
  const CertificatePaths job = Certificates("job");
  absl::StatusOr<std::shared_ptr<const Security>> tls = Security::Load(Tls(job));
  ASSERT_THAT(tls, IsOk());
  tessera::v1::ParameterServer::CallbackService second;
  EXPECT_THAT(StartGrpcServer("0.0.0.0", 0, {&second}, **tls), IsOk());
}

TEST_F(AuthTest, CredentialFilesAreCheckedAtStartUp) {
  SecurityOptions options;
  options.token_file = dir_ + "/missing";
  EXPECT_THAT(Security::Load(options), StatusIs(absl::StatusCode::kInvalidArgument, "--token_file"));
  std::ofstream(dir_ + "/short") << "abc\n";
  options.token_file = dir_ + "/short";
  EXPECT_THAT(Security::Load(options), StatusIs(absl::StatusCode::kInvalidArgument, "shorter than 16"));
  options = {};
  options.tls_cert = dir_ + "/cert.pem";
  EXPECT_THAT(Security::Load(options), StatusIs(absl::StatusCode::kInvalidArgument, "go together"));
}

// Pushes 1.0 into every value of the 64-value parameter "w" of `map` over UCX as `who`, with `security`'s
// token: the first failed chunk call's status, or OK.
absl::Status UcxPushAs(const tessera::v1::ShardMap& map, std::shared_ptr<const Security> security,
                       const CallerIdentity& who) {
  absl::StatusOr<std::unique_ptr<UcxChunkTransport>> transport = UcxChunkTransport::Start(std::move(security), who);
  if (!transport.ok()) return transport.status();
  ChunkCaller caller(*std::move(transport));
  const std::vector<float> grad(64, 1.0f);
  auto calls = caller.Make(kPush, std::make_shared<const ShardMapIndex>(map), 0, "w", grad, 1, {}, Stamp{1000, 0},
                           who, {}, absl::Seconds(10));
  if (!calls.ok()) return calls.status();
  ChunkBatch batch(8);  // destroyed before the transport
  for (auto& c : *calls) batch.Add(std::move(c));
  batch.WaitAll();
  for (ChunkCall* c : batch.calls()) {
    if (!c->status.ok()) return c->status;
  }
  return absl::OkStatus();
}

// Over UCX (transport: UCX, trusted_network), a connection is accepted only with the job token and the worker's
// member key; without them no value moves. With them, the same push goes through.
TEST_F(AuthTest, AUcxConnectionWithoutTheTokenOrTheMemberKeyMovesNoValue) {
  SecurityOptions security;
  security.token_file = token_file_;
  tessera::v1::JobSpec job = TestJob(ConsistencySpec::ASYNC, 2, 1);
  job.set_transport(tessera::v1::UCX);
  job.set_trusted_network(true);
  auto cluster = MiniCluster::Start(job, absl::Minutes(5), security);
  ASSERT_THAT(cluster, IsOk());
  auto client = (*cluster)->ConnectClient();
  ASSERT_THAT(client, IsOk());
  ASSERT_THAT((*client)->Declare({FloatParam("w", 64)}), IsOk());
  std::vector<float> before(64);
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(before)}), IsOk());  // over UCX, with the token and key
  const tessera::v1::ShardMap map = *(*client)->shard_map();
  ASSERT_FALSE(map.servers(0).fabric_address().empty()) << map.DebugString();
  absl::StatusOr<std::shared_ptr<const Security>> with_token = Security::Load(security);
  ASSERT_THAT(with_token, IsOk());
  const CallerIdentity who{(*client)->worker_id(), (*client)->incarnation(), (*client)->member_key()};

  EXPECT_THAT(UcxPushAs(map, Security::Plaintext(), who), StatusIs(absl::StatusCode::kUnauthenticated, "token"));
  CallerIdentity wrong_key = who;
  wrong_key.member_key = "not-the-member-key";
  EXPECT_THAT(UcxPushAs(map, *with_token, wrong_key),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong member key"));
  std::vector<float> after(64);
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(after)}), IsOk());
  EXPECT_EQ(before, after) << "a refused connection changed values";

  EXPECT_THAT(UcxPushAs(map, *with_token, who), IsOk());
  ASSERT_THAT((*client)->Pull({"w"}, {absl::MakeSpan(after)}), IsOk());
  EXPECT_NE(before, after) << "the accepted push was not applied";
}

}  // namespace
}  // namespace tessera::testing

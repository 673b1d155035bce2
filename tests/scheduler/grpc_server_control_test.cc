// GrpcServerControl against a server that froze (its AssignShards never answers): once the job has stopped, an
// Assign waiting on it is cancelled at once instead of holding the job's end for its deadline, and no later
// Assign is sent.
#include "scheduler/grpc_server_control.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "grpcpp/server_builder.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

// A server that takes AssignShards calls and answers none until it is released.
class FrozenServer final : public tessera::v1::ParameterServer::Service {
 public:
  FrozenServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FrozenServer() override {
    released_.Notify();
    server_->Shutdown();
  }
  int port() const { return port_; }
  bool reached() const { return reached_.HasBeenNotified(); }

  grpc::Status AssignShards(grpc::ServerContext*, const tessera::v1::AssignShardsRequest*,
                            tessera::v1::AssignShardsResponse*) override {
    reached_.Notify();
    released_.WaitForNotification();
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  absl::Notification reached_, released_;
  std::unique_ptr<grpc::Server> server_;
};

tessera::v1::ShardMap MapWithOneServerAt(int port) {
  tessera::v1::ShardMap map;
  map.set_epoch(1);
  auto* server = map.add_servers();
  server->set_id(0);
  server->set_address(absl::StrCat("127.0.0.1:", port));
  return map;
}

TEST(GrpcServerControlTest, EndingViewChangesCancelsAnAssignWaitingOnAFrozenServerAndRefusesLaterOnes) {
  FrozenServer frozen;
  GrpcServerControl grpc_control(Security::Plaintext());
  ServerControl& control = grpc_control;
  const tessera::v1::ShardMap map = MapWithOneServerAt(frozen.port());
  std::optional<absl::Status> answer;
  absl::Notification answered;
  std::thread assign([&] {
    answer = control.Assign(map, tessera::v1::JobSpec());
    answered.Notify();
  });
  // The call reaches the server and waits on it (its deadline is far longer than this).
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_TRUE(frozen.reached());
  const absl::Time ended = absl::Now();
  control.EndViewChanges();
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - ended, absl::Seconds(5));
  assign.join();
  ASSERT_TRUE(answer.has_value());
  EXPECT_THAT(*answer, StatusIs(absl::StatusCode::kCancelled, ""));
  const absl::Time later = absl::Now();
  EXPECT_THAT(control.Assign(map, tessera::v1::JobSpec()),
              StatusIs(absl::StatusCode::kCancelled, "no view is handed over"));
  EXPECT_LT(absl::Now() - later, absl::Seconds(1));
}

}  // namespace
}  // namespace tessera::testing

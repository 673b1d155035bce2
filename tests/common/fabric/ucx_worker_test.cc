// UcxWorker: which transports a process's UCX may use, its address, and the address's form in the view.
#include "common/fabric/ucx_worker.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

void ExpectValue(const absl::StatusOr<std::string>& got, const std::string& want) {
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
}

TEST(UcxWorkerTest, TcpIsTakenOutOfEveryFormOfUcxTls) {
  ExpectValue(TransportsWithoutTcp("all"), std::string("^tcp"));
  ExpectValue(TransportsWithoutTcp(""), std::string("^tcp"));
  ExpectValue(TransportsWithoutTcp("^ud"), std::string("^ud,tcp"));
  ExpectValue(TransportsWithoutTcp("^tcp,ud"), std::string("^tcp,ud"));
  ExpectValue(TransportsWithoutTcp("sm,tcp,cma"), std::string("sm,cma"));
  ExpectValue(TransportsWithoutTcp("sm"), std::string("sm"));
  EXPECT_THAT(TransportsWithoutTcp("tcp"), StatusIs(absl::StatusCode::kInvalidArgument, "--fabric_tcp"));
}

TEST(UcxWorkerTest, FabricAddressesTravelAsBase64AndAnythingElseIsRefused) {
  const std::string bytes("\x00\x01\xfe\xff binary", 11);
  ExpectValue(DecodeFabricAddress(EncodeFabricAddress(bytes)), bytes);
  EXPECT_THAT(DecodeFabricAddress(""), StatusIs(absl::StatusCode::kInvalidArgument, "base64"));
  EXPECT_THAT(DecodeFabricAddress("127.0.0.1:4000"), StatusIs(absl::StatusCode::kInvalidArgument, "base64"));
}

TEST(UcxWorkerTest, AWorkerHasAnAddressWithOrWithoutTcp) {
  for (bool tcp : {false, true}) {
    absl::StatusOr<std::unique_ptr<UcxWorker>> worker = UcxWorker::Start("test", FabricOptions{0, tcp});
    if (!worker.ok() && worker.status().code() == absl::StatusCode::kUnavailable) {
      GTEST_SKIP() << "UCX cannot start here: " << worker.status();
    }
    ASSERT_THAT(worker, IsOk());
    EXPECT_FALSE((*worker)->address().empty()) << "tcp " << tcp;
  }
}

}  // namespace
}  // namespace tessera::testing

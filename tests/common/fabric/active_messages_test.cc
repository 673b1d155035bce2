// Active messages: what a request holds lives until UCX completes the request, or until its worker is destroyed.
#include "common/fabric/active_messages.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "common/fabric/ucx_worker.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {
namespace {

// Keeps a rendezvous message's data without ever receiving it, so that its sender's request stays in flight.
ucs_status_t KeepWithoutReceiving(void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t* param) {
  ++*static_cast<std::atomic<int>*>(arg);
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_INPROGRESS : UCS_OK;
}

TEST(ActiveMessagesTest, WhatASendToAPeerThatDiedHoldsIsFreedWithItsWorker) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> sender = UcxWorker::Start("sender");
  if (!sender.ok() && sender.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "UCX cannot start here: " << sender.status();
  }
  ASSERT_THAT(sender, IsOk());
  absl::StatusOr<std::unique_ptr<UcxWorker>> receiver = UcxWorker::Start("receiver");
  ASSERT_THAT(receiver, IsOk());
  std::atomic<int> arrived{0};
  absl::Status handler;
  (*receiver)->Run([&] { handler = (*receiver)->SetHandler(kFabricRequest, KeepWithoutReceiving, &arrived); });
  ASSERT_THAT(handler, IsOk());

  // Large enough to go as a rendezvous over any transport.
  auto values = std::make_shared<std::vector<char>>(8 << 20, 1);
  const std::weak_ptr<std::vector<char>> held = values;
  std::atomic<int> outcomes{0};
  ucp_ep_h ep = nullptr;
  ucs_status_t created = UCS_OK;
  const std::string address = (*receiver)->address();
  (*sender)->Run([&] {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    created = ucp_ep_create((*sender)->worker(), &params, &ep);
    if (created != UCS_OK) return;
    const char* data = values->data();
    const size_t length = values->size();
    SendActiveMessage(**sender, ep, kFabricRequest, "header", data, length, std::move(values),
                      [&](const absl::Status&) { ++outcomes; });
  });
  ASSERT_EQ(created, UCS_OK) << ucs_status_string(created);
  for (absl::Time until = absl::Now() + absl::Seconds(20); arrived == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GT(arrived, 0) << "the message never reached the receiver";
  EXPECT_FALSE(held.expired()) << "the send is in flight, its data must be kept";

  receiver->reset();  // the peer dies holding the data: UCX never completes the send
  (*sender)->Run([&] { CloseEndpoint(ep); });
  sender->reset();
  EXPECT_TRUE(held.expired()) << "the in-flight send's state outlived its worker";
  EXPECT_LE(outcomes, 1);
}

}  // namespace
}  // namespace tessera::testing

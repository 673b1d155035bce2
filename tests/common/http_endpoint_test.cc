// HttpEndpoint under clients that send slowly: a request's headers have a deadline as a whole (not per line),
// slow clients hold no thread, and /healthz answers at once however many of them send.
#include "common/daemon/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (a read returns 0 or an error) within `within`.
bool ClosedWithin(int fd, absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  while (absl::Now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) == 1) {
      char byte;
      if (recv(fd, &byte, 1, MSG_DONTWAIT) <= 0) return true;
    }
  }
  return false;
}

class HttpEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<HttpEndpoint>> started = HttpEndpoint::Start(
        "127.0.0.1", 0, *Security::Plaintext(),
        {{"/metrics", {"text/plain", [] { return std::string("tessera_up 1\n"); }}}});
    ASSERT_TRUE(started.ok()) << started.status();
    http_ = std::move(*started);
  }

  // GET `path`: the status, or -1 when no answer came within `within`.
  int Get(const std::string& path, absl::Duration within) {
    httplib::Client client("127.0.0.1", http_->port());
    client.set_connection_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(within)));
    client.set_read_timeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(within)));
    httplib::Result result = client.Get(path);
    return result ? result->status : -1;
  }

  std::unique_ptr<HttpEndpoint> http_;
};

// A client that sends a header line every 300 ms never completes its request: it is cut off once the request's
// deadline passes, though each line came well within a second.
TEST_F(HttpEndpointTest, ARequestWhoseHeadersTrickleInIsCutOffAtItsDeadline) {
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  const std::string start = "GET /metrics HTTP/1.1\r\n";
  ASSERT_EQ(send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
  const absl::Time began = absl::Now();
  bool closed = false;
  for (int line = 0; line < 40 && !closed; ++line) {
    const std::string header = "X-Slow: " + std::to_string(line) + "\r\n";
    if (send(fd, header.data(), header.size(), MSG_NOSIGNAL) < 0) break;
    closed = ClosedWithin(fd, absl::Milliseconds(300));
  }
  const absl::Duration took = absl::Now() - began;
  close(fd);
  EXPECT_TRUE(closed) << "a request whose headers trickle in was never cut off";
  EXPECT_LT(took, absl::Milliseconds(HttpEndpoint::kRequestReadMs + 1500));
}

// 64 clients each sending one header line every 300 ms: /healthz (and any complete request) still answers at
// once, again and again, while they send.
TEST_F(HttpEndpointTest, SlowClientsDoNotStarveHealthz) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> slow;
  for (int c = 0; c < 64; ++c) {
    slow.emplace_back([&, c] {
      while (!stop) {
        const int fd = Connect(http_->port());
        if (fd < 0) return;
        const std::string start = "GET /metrics HTTP/1.1\r\n";
        send(fd, start.data(), start.size(), MSG_NOSIGNAL);
        for (int line = 0; !stop && line < 100; ++line) {
          const std::string header = "X-Client-" + std::to_string(c) + ": " + std::to_string(line) + "\r\n";
          if (send(fd, header.data(), header.size(), MSG_NOSIGNAL) < 0) break;
          absl::SleepFor(absl::Milliseconds(300));
        }
        close(fd);
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // every slow client is in
  for (int probe = 0; probe < 10; ++probe) {
    const absl::Time start = absl::Now();
    EXPECT_EQ(Get("/healthz", absl::Seconds(3)), 200) << "probe " << probe;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "probe " << probe << ": /healthz was held up";
    EXPECT_EQ(Get("/metrics", absl::Seconds(3)), 200) << "probe " << probe;
    absl::SleepFor(absl::Milliseconds(400));
  }
  stop = true;
  for (std::thread& t : slow) t.join();
}

// A request whose headers exceed the limit is refused by closing its connection, not read on and on.
TEST_F(HttpEndpointTest, HeadersOverTheLimitCloseTheConnection) {
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  std::string request = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(HttpEndpoint::kMaxHeaderBytes + 1024, 'a');
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(ClosedWithin(fd, absl::Seconds(2)));
  close(fd);
  EXPECT_EQ(Get("/healthz", absl::Seconds(3)), 200);
}

}  // namespace
}  // namespace tessera

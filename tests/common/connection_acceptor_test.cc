#include "common/rpc/connection_acceptor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"

namespace tessera {
namespace {

// A client connection to 127.0.0.1:`port`, non-blocking (a listener that stopped accepting cannot hang a test).
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  return fd;
}

void Say(int fd) {
  for (int i = 0; i < 100 && send(fd, "x", 1, MSG_NOSIGNAL) != 1; ++i) absl::SleepFor(absl::Milliseconds(10));
}

int OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n - 3;
}

// Collects what the acceptor hands over, as a server that keeps its connections would.
class Held {
 public:
  void Take(int fd) {
    absl::MutexLock lock(&mu_);
    fds_.push_back(fd);
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return fds_.size();
  }
  bool WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fds_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  void CloseAll() {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) close(fd);
    fds_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

TEST(ConnectionAcceptorTest, AClientThatSpeaksIsServedThroughAnyNumberOfSilentOnes) {
  Held held;
  ConnectionAcceptor::Options options;
  options.max_silent = 8;
  options.silent_timeout = absl::Milliseconds(300);
  auto acceptor = ConnectionAcceptor::Listen("127.0.0.1", 0, options, [&](int fd) { held.Take(fd); });
  ASSERT_TRUE(acceptor.ok()) << acceptor.status();
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(Connect((*acceptor)->port()));
  const int talker = Connect((*acceptor)->port());
  Say(talker);
  EXPECT_TRUE(held.WaitFor(1, absl::Seconds(5))) << "the connection that spoke was never handed over";
  EXPECT_EQ(held.size(), 1u) << "a silent connection was handed over";
  // Silent connections are closed: those past the cap at once, the rest after the timeout.
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ((*acceptor)->closed_silent(), 200);
  for (int fd : idle) close(fd);
  close(talker);
  held.CloseAll();
}

// The process runs out of descriptors while a flood of talking clients arrives: connections past the reserve
// are refused, the listener keeps accepting, and once descriptors are free again new clients are served.
TEST(ConnectionAcceptorTest, TheListenerOutlivesRunningOutOfDescriptors) {
#if TESSERA_HAS_ADDRESS_SANITIZER
  // The sanitizer build is AddressSanitizer with UndefinedBehaviorSanitizer, whose type checks need a descriptor
  // of their own (a pipe, to probe memory): in a process out of descriptors they report every virtual call.
  GTEST_SKIP() << "the sanitizers' own checks need descriptors this test takes away";
#endif
  // As in the daemons: logs go to stderr (glog would otherwise open log files, with no descriptor to spare).
  FLAGS_logtostderr = true;
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = OpenDescriptors() + 200;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);

  Held held;
  auto acceptor = ConnectionAcceptor::Listen("127.0.0.1", 0, {}, [&](int fd) { held.Take(fd); });
  ASSERT_TRUE(acceptor.ok()) << acceptor.status();
  std::vector<int> clients;
  // 100 clients, with the server's side of each, are more than the limit allows, in any order the acceptor's
  // thread gets to run: even when every client connects before it accepts one, 200 - 100 - the reserve (32)
  // - its own few descriptors leave it more than 20 to take. (With 150, a loaded machine left it 14.)
  for (int i = 0; i < 100; ++i) {
    const int fd = Connect((*acceptor)->port());
    if (fd < 0) break;
    Say(fd);
    clients.push_back(fd);
  }
  // The acceptor takes what the limit allows and refuses the rest (a loaded machine may take a while).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && (held.size() <= 20u || (*acceptor)->refused_for_descriptors() == 0)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GT(held.size(), 20u);
  EXPECT_GT((*acceptor)->refused_for_descriptors(), 0) << "the limit was never reached, so this test showed nothing";
  for (int fd : clients) close(fd);
  held.CloseAll();

  const size_t before = held.size();
  const int late = Connect((*acceptor)->port());
  Say(late);
  EXPECT_TRUE(held.WaitFor(before + 1, absl::Seconds(5))) << "the listener stopped after running out of descriptors";
  close(late);
  held.CloseAll();
  acceptor->reset();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

TEST(ConnectionAcceptorTest, APortInUseIsUnavailable) {
  auto first = ConnectionAcceptor::Listen("127.0.0.1", 0, {}, [](int fd) { close(fd); });
  ASSERT_TRUE(first.ok());
  auto second = ConnectionAcceptor::Listen("127.0.0.1", (*first)->port(), {}, [](int fd) { close(fd); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(ConnectionAcceptorTest, RaisingTheLimitReachesTheHardLimit) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const int64_t raised = ConnectionAcceptor::RaiseDescriptorLimit();
  if (limit.rlim_max != RLIM_INFINITY) EXPECT_EQ(raised, static_cast<int64_t>(limit.rlim_max));
}

}  // namespace
}  // namespace tessera

// Connection floods against real daemons: however many idle connections arrive, from however many hosts, and
// even past the process's descriptor limit, no listener stops, training goes on and /healthz answers at once.
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc/connection_acceptor.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_test.h"
#include "tests/testing/ports.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/subprocess.h"

namespace tessera::testing {
namespace {

using FloodTest = DaemonTest;

// The descriptor limit the daemons run under (soft and hard), far below the flood.
constexpr int kDaemonDescriptors = 256;
// Idle connections per listener, spread over kFloodHosts loopback source addresses.
constexpr int kFloodPerListener = 1200;
constexpr int kFloodHosts = 8;

// Opens `count` idle connections to 127.0.0.1:`port` from 127.0.0.2..; never sends a byte. Non-blocking
// connects, so a listener that stopped accepting cannot hang the test.
std::vector<int> Flood(int port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + i % kFloodHosts);
    bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(port);
    connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to));
    fds.push_back(fd);
  }
  return fds;
}

// The gRPC health service answers within `within`.
void ExpectGrpcHealthy(int port, absl::Duration within, const std::string& what) {
  const absl::Time start = absl::Now();
  std::string reply;
  EXPECT_TRUE(RawUnary(MakeChannel(absl::StrCat("127.0.0.1:", port), *Security::Plaintext()),
                       "/grpc.health.v1.Health/Check", std::string(), {}, &reply, within)
                  .ok())
      << what;
  EXPECT_LT(absl::Now() - start, within) << what;
}

// GET /healthz answers "ok" within `within`.
void ExpectHttpHealthy(int port, absl::Duration within, const std::string& what) {
  const absl::Time start = absl::Now();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(absl::ToInt64Seconds(within) + 1, 0);
  client.set_read_timeout(absl::ToInt64Seconds(within) + 1, 0);
  httplib::Result got = client.Get("/healthz");
  ASSERT_TRUE(got) << what << ": " << httplib::to_string(got.error());
  EXPECT_EQ(got->status, 200) << what;
  EXPECT_LT(absl::Now() - start, within) << what;
}

TEST_F(FloodTest, IdleConnectionsPastTheDescriptorLimitStopNoListenerNorTraining) {
  ConnectionAcceptor::RaiseDescriptorLimit();  // the flood is this process's, not the daemons'
  const std::string limit = absl::StrCat("ulimit -n ", kDaemonDescriptors, " && exec \"$0\" \"$@\"");
  const std::string job = Write("flood.pbtxt", R"(
name: "flood"
model { mlp { hidden_sizes: 16 } }
data { format: SYNTHETIC }
consistency { mode: SYNC }
stop { max_steps: 100000000 }
eval_every_steps: 100
cluster { num_servers: 1 num_workers: 1 }
)");
  Subprocess scheduler({"/bin/sh", "-c", limit, kBin + "/tessera-scheduler", "--job=" + job,
                        "--run_dir=" + (dir_ / "run").string()});
  ASSERT_TRUE(scheduler.ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << scheduler.output();
  ASSERT_TRUE(scheduler.ReadUntilLine("dashboard at http://127.0.0.1:", absl::Seconds(30))) << scheduler.output();
  const std::string address = SchedulerAddress(scheduler.output());
  Subprocess server({"/bin/sh", "-c", limit, kBin + "/tessera-server", "--scheduler=" + address});
  Subprocess worker({"/bin/sh", "-c", limit, kBin + "/tessera-worker", "--scheduler=" + address, "--device=cpu"});
  ASSERT_TRUE(server.ReadUntilLine("metrics at http://127.0.0.1:", absl::Seconds(30))) << server.output();
  ASSERT_TRUE(scheduler.ReadUntilLine("step    100 |", absl::Seconds(120))) << scheduler.output();

  const std::map<std::string, int> grpc_ports = {{"scheduler gRPC", PortAfter(address, "127.0.0.1:")},
                                                 {"server gRPC", PortAfter(server.output(), "serving at 127.0.0.1:")}};
  const std::map<std::string, int> http_ports = {
      {"scheduler HTTP", PortAfter(scheduler.output(), "dashboard at http://127.0.0.1:")},
      {"server HTTP", PortAfter(server.output(), "metrics at http://127.0.0.1:")}};
  std::vector<int> flood;
  for (const auto* ports : {&grpc_ports, &http_ports}) {
    for (const auto& [what, port] : *ports) {
      ASSERT_GT(port, 0) << what << "\n" << scheduler.output() << server.output();
      std::vector<int> more = Flood(port, kFloodPerListener);
      EXPECT_EQ(more.size(), static_cast<size_t>(kFloodPerListener)) << what;
      flood.insert(flood.end(), more.begin(), more.end());
    }
  }
  absl::SleepFor(absl::Seconds(1));  // let the daemons take the flood off their queues

  // While the flood is held: training goes on and every listener answers at once.
  for (const auto& [what, port] : http_ports) ExpectHttpHealthy(port, absl::Seconds(1), what + " during the flood");
  for (const auto& [what, port] : grpc_ports) ExpectGrpcHealthy(port, absl::Seconds(2), what + " during the flood");
  const int64_t before = LastStep(scheduler.output());
  const std::string later = absl::StrFormat("step %6d |", (before / 100 + 3) * 100);
  EXPECT_TRUE(scheduler.ReadUntilLine(later, absl::Seconds(60))) << "training stalled after step " << before
                                                                 << ":\n" << scheduler.output();
  for (int fd : flood) close(fd);

  // After it: still listening (gRPC's own listener stopped for good once accept failed with EMFILE).
  for (const auto& [what, port] : http_ports) ExpectHttpHealthy(port, absl::Seconds(1), what + " after the flood");
  for (const auto& [what, port] : grpc_ports) ExpectGrpcHealthy(port, absl::Seconds(2), what + " after the flood");
}

}  // namespace
}  // namespace tessera::testing

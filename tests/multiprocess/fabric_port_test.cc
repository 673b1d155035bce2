// The fabric's attack surface, against real daemons on a UCX job: a server and a worker listen on no port but
// their gRPC and HTTP ones (UCX connections are set up with worker addresses carried by the authenticated
// cluster view), and the bytes of peers that never authenticated, thrown at every port the server does listen
// on, crash, stall and exhaust nothing: training goes on, both health checks answer, and the server's
// descriptors come back to where they were. With --fabric_tcp, UCX's own TCP ports exist; random first bytes
// thrown at them crash nothing either (what UCX's protocol code does with a peer that speaks it is UCX's; see
// SECURITY.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon_test.h"
#include "tests/testing/raw_rpc.h"
#include "tests/testing/subprocess.h"

namespace tessera::testing {
namespace {

// The socket inodes among `pid`'s descriptors, and how many descriptors it holds.
std::set<std::string> SocketInodes(pid_t pid, int* descriptors = nullptr) {
  std::set<std::string> inodes;
  int count = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), error)) {
    ++count;
    std::error_code ignored;
    const std::string target = std::filesystem::read_symlink(entry.path(), ignored).string();
    if (absl::StartsWith(target, "socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  if (descriptors != nullptr) *descriptors = count;
  return inodes;
}

// The TCP ports `pid` listens on (IPv4 and IPv6, any address), from /proc/net/tcp{,6}.
std::set<int> ListeningPorts(pid_t pid) {
  const std::set<std::string> inodes = SocketInodes(pid);
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      if (f.size() < 10 || f[3] != "0A" || inodes.count(f[9]) == 0) continue;
      int port = 0;
      const std::string hex = f[1].substr(f[1].rfind(':') + 1);
      port = static_cast<int>(std::strtol(hex.c_str(), nullptr, 16));
      ports.insert(port);
    }
  }
  return ports;
}

// Connects to 127.0.0.1:`port`, sends `bytes` and closes (or, with `hold`, returns the descriptor open). -1 when
// the connection failed.
int SendFirstBytes(int port, const std::string& bytes, bool hold = false) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  if (!bytes.empty()) (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  if (hold) return fd;
  close(fd);
  return 0;
}

std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
  return out;
}

std::string Random(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// The first bytes of hostile connections: a connection manager's length-prefixed header announcing 10 bytes
// followed by 3,000, one announcing 2^64-1 (the length wraps), a length-prefixed request with a garbage body,
// random requests of 24 and 2,048 bytes, a TLS and an HTTP/2 preface cut short, and random lengths.
std::vector<std::string> HostileFirstBytes(uint64_t seed, int random_count) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out = {
      Le64(10) + Le64(0) + Random(rng, 3000),
      Le64(~uint64_t{0}) + Le64(0) + Random(rng, 64),
      Le64(512) + Le64(1) + Random(rng, 512),
      Random(rng, 24),
      Random(rng, 2048),
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04",
      "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\n",
  };
  for (int i = 0; i < random_count; ++i) {
    std::string header = Le64(rng() >> (rng() % 64)) + Le64(rng());
    out.push_back(header + Random(rng, rng() % 4096));
  }
  return out;
}

struct UcxCluster {
  std::unique_ptr<Subprocess> scheduler, server, worker;
  std::string address;
};

class FabricPortTest : public DaemonTest {
 protected:
  // A UCX job that trains until stopped, a server and a worker started with `extra` flags.
  UcxCluster StartUcxCluster(const std::vector<std::string>& extra);
};

UcxCluster FabricPortTest::StartUcxCluster(const std::vector<std::string>& extra) {
  const std::string job = Write("fabric.pbtxt", R"(
name: "fabric-port"
transport: UCX
trusted_network: true
model { mlp { hidden_sizes: 16 } }
data { format: SYNTHETIC }
consistency { mode: SYNC }
stop { max_steps: 100000000 }
eval_every_steps: 100
cluster { num_servers: 1 num_workers: 1 }
)");
  UcxCluster c;
  c.scheduler = std::make_unique<Subprocess>(std::vector<std::string>{
      kBin + "/tessera-scheduler", "--job=" + job, "--run_dir=" + (dir_ / "run").string()});
  EXPECT_TRUE(c.scheduler->ReadUntilLine("scheduler listening on ", absl::Seconds(30))) << c.scheduler->output();
  c.address = SchedulerAddress(c.scheduler->output());
  std::vector<std::string> server = {kBin + "/tessera-server", "--scheduler=" + c.address};
  std::vector<std::string> worker = {kBin + "/tessera-worker", "--scheduler=" + c.address, "--device=cpu"};
  server.insert(server.end(), extra.begin(), extra.end());
  worker.insert(worker.end(), extra.begin(), extra.end());
  c.server = std::make_unique<Subprocess>(server);
  c.worker = std::make_unique<Subprocess>(worker);
  EXPECT_TRUE(c.server->ReadUntilLine("metrics at http://127.0.0.1:", absl::Seconds(30))) << c.server->output();
  EXPECT_TRUE(c.scheduler->ReadUntilLine("step    100 |", absl::Seconds(120))) << c.scheduler->output();
  return c;
}

// Both of the server's health checks answer (each try may take 2 s; the acceptor may still be closing the
// assault's connections, slowly under a sanitizer), and training passes two more progress lines.
void ExpectServing(UcxCluster& c, int grpc_port, int http_port, const std::string& when) {
  auto grpc_healthy = [&] {
    std::string reply;
    return RawUnary(MakeChannel(absl::StrCat("127.0.0.1:", grpc_port), *Security::Plaintext()),
                    "/grpc.health.v1.Health/Check", std::string(), {}, &reply, absl::Seconds(2))
        .ok();
  };
  auto http_healthy = [&] {
    httplib::Client http("127.0.0.1", http_port);
    http.set_connection_timeout(2, 0);
    http.set_read_timeout(2, 0);
    httplib::Result got = http.Get("/healthz");
    return got && got->status == 200;
  };
  const absl::Time until = absl::Now() + absl::Seconds(15);
  bool grpc = grpc_healthy(), http = http_healthy();
  while ((!grpc || !http) && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(200));
    grpc = grpc || grpc_healthy();
    http = http || http_healthy();
  }
  EXPECT_TRUE(grpc) << "server gRPC health " << when;
  EXPECT_TRUE(http) << "server /healthz " << when;
  const int64_t before = LastStep(c.scheduler->output());
  const std::string later = absl::StrFormat("step %6d |", (before / 100 + 2) * 100);
  EXPECT_TRUE(c.scheduler->ReadUntilLine(later, absl::Seconds(60)))
      << "training stalled " << when << " after step " << before << ":\n"
      << c.scheduler->output() << c.server->output() << c.worker->output();
  EXPECT_EQ(kill(c.server->pid(), 0), 0) << "the server is gone " << when << ":\n" << c.server->output();
}

// Throws `first_bytes` at `port` one connection each, then holds `silent` connections that send nothing.
std::vector<int> Assault(int port, const std::vector<std::string>& first_bytes, int silent) {
  for (const std::string& bytes : first_bytes) SendFirstBytes(port, bytes);
  std::vector<int> held;
  for (int i = 0; i < silent; ++i) {
    const int fd = SendFirstBytes(port, "", /*hold=*/true);
    if (fd >= 0) held.push_back(fd);
  }
  return held;
}

TEST_F(FabricPortTest, AUcxJobsDaemonsListenOnNoPortButTheirOwnAndHostileBytesHarmNothing) {
  UcxCluster c = StartUcxCluster({});
  const int grpc_port = PortAfter(c.server->output(), "serving at 127.0.0.1:");
  const int http_port = PortAfter(c.server->output(), "metrics at http://127.0.0.1:");
  ASSERT_GT(grpc_port, 0) << c.server->output();
  ASSERT_GT(http_port, 0) << c.server->output();
  EXPECT_EQ(ListeningPorts(c.server->pid()), (std::set<int>{grpc_port, http_port}))
      << "a UCX server listens on a port of UCX's:\n" << c.server->output();
  ASSERT_TRUE(c.worker->ReadUntilLine("metrics at http://127.0.0.1:", absl::Seconds(30))) << c.worker->output();
  const int worker_http_port = PortAfter(c.worker->output(), "metrics at http://127.0.0.1:");
  EXPECT_EQ(ListeningPorts(c.worker->pid()), std::set<int>{worker_http_port})
      << "a UCX worker listens on a port of UCX's:\n" << c.worker->output();

  int descriptors_before = 0;
  SocketInodes(c.server->pid(), &descriptors_before);
  for (int port : {grpc_port, http_port}) {
    std::vector<int> held = Assault(port, HostileFirstBytes(port, 100), 200);
    ExpectServing(c, grpc_port, http_port, absl::StrCat("while 200 silent connections to port ", port, " are held"));
    for (int fd : held) close(fd);
  }
  ExpectServing(c, grpc_port, http_port, "after the assault");
  // The server let go of the assault's descriptors (within the acceptor's idle timeouts).
  int descriptors_after = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    absl::SleepFor(absl::Milliseconds(200));
    SocketInodes(c.server->pid(), &descriptors_after);
  } while (descriptors_after > descriptors_before + 8 && absl::Now() < deadline);
  EXPECT_LE(descriptors_after, descriptors_before + 8) << "the server keeps the assault's descriptors";
}

TEST_F(FabricPortTest, WithFabricTcpUcxsOwnPortsSurviveRandomFirstBytes) {
  UcxCluster c = StartUcxCluster({"--fabric_tcp"});
  const int grpc_port = PortAfter(c.server->output(), "serving at 127.0.0.1:");
  const int http_port = PortAfter(c.server->output(), "metrics at http://127.0.0.1:");
  std::set<int> ucx_ports = ListeningPorts(c.server->pid());
  ucx_ports.erase(grpc_port);
  ucx_ports.erase(http_port);
  ASSERT_FALSE(ucx_ports.empty()) << "with --fabric_tcp, UCX listens on TCP";
  for (int port : ucx_ports) {
    std::vector<int> held = Assault(port, HostileFirstBytes(port, 200), 100);
    for (int fd : held) close(fd);
  }
  ExpectServing(c, grpc_port, http_port, "after random first bytes at UCX's TCP ports");
}

}  // namespace
}  // namespace tessera::testing

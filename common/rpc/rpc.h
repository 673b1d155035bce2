// gRPC plumbing shared by every role: channels, server start-up, deadlines and bounded retries.
#ifndef TESSERA_COMMON_RPC_RPC_H_
#define TESSERA_COMMON_RPC_RPC_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/connection_acceptor.h"
#include "common/rpc/security.h"

namespace tessera {

// Largest message any Tessera endpoint sends or accepts (a chunk is at most 64 MiB plus its header).
inline constexpr int kMaxMessageBytes = (64 << 20) + (1 << 20);

// A connection must finish its HTTP/2 (and TLS) handshake within this long of its first bytes.
inline constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

// Initial HTTP/2 stream window of every Tessera channel and server.
inline constexpr int kFlowControlWindowBytes = 8 << 20;

// A channel to `address` (HOST:PORT) with Tessera's message limits, over TLS when `security` has it.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Security& security);

// Sets `context`'s deadline `timeout` from now.
void SetTimeout(grpc::ClientContext& context, absl::Duration timeout);

// A started gRPC server, the port it listens on, and the acceptor in front of it (common/rpc/connection_acceptor.h:
// gRPC's own listener stops for good when the process runs out of descriptors, so Tessera accepts connections
// itself and hands gRPC only those that have spoken).
struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<ConnectionAcceptor> acceptor;  // hands connections to `server`
  int port = 0;

  // Stops accepting, then shuts the server down, letting calls in flight finish for up to `grace`.
  void Shutdown(absl::Duration grace);
};

// Binds `host:port` (port 0: any free port) and starts serving `services` (not owned; must outlive the server),
// over TLS when `security` has it. UNAVAILABLE naming the address and port when the bind fails; a port already
// in use fails (no SO_REUSEPORT). FAILED_PRECONDITION for plaintext on a non-loopback host without --insecure.
// A connection that does not finish its handshake within kHandshakeTimeout is closed.
[[nodiscard]] absl::StatusOr<StartedServer> StartGrpcServer(const std::string& host, int port,
                                                            const std::vector<grpc::Service*>& services,
                                                            const Security& security);

// The stubs of one kind a process reaches its peers with: one per (address, lane), each on a connection of its
// own from MakeChannel, made on first use and kept for the process's life (a peer that comes back at the same
// address is reached again on the same connection). Thread-safe; the stubs are thread-safe too.
template <typename Stub>
class StubCache {
 public:
  // `security` gives every channel its TLS; `make` wraps a channel in a stub.
  StubCache(std::shared_ptr<const Security> security,
            std::function<std::unique_ptr<Stub>(std::shared_ptr<grpc::Channel>)> make)
      : security_(std::move(security)), make_(std::move(make)) {}

  Stub* Get(const std::string& address, int lane = 0) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Stub>& stub = stubs_[{address, lane}];
    if (!stub) stub = make_(MakeChannel(address, *security_));
    return stub.get();
  }

 private:
  const std::shared_ptr<const Security> security_;
  const std::function<std::unique_ptr<Stub>(std::shared_ptr<grpc::Channel>)> make_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, int>, std::unique_ptr<Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// Exponential backoff between attempts of a remote call: the first pause is `initial`, each next one twice the
// last, at most `max`.
class Backoff {
 public:
  Backoff(absl::Duration initial, absl::Duration max) : next_(initial), max_(max) {}
  // Waits the next pause, ending by `deadline` at the latest. With `channel`, watches it connect instead of
  // sleeping (see RetryPolicy::channel) and returns as soon as it has.
  void Wait(absl::Time deadline = absl::InfiniteFuture(), grpc::Channel* channel = nullptr);

 private:
  absl::Duration next_;
  const absl::Duration max_;
};

// Retries with exponential backoff, for calls that fail with UNAVAILABLE (nobody answered yet), for up to
// `give_up_after`. Channels from MakeChannel reconnect at least once a second, so a peer that comes up is reached
// within about a second.
struct RetryPolicy {
  absl::Duration give_up_after = absl::Seconds(120);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // Printed once (to the log, as a warning) at the first UNAVAILABLE, when not empty: "waiting for X".
  std::string waiting_line;
  // The channel the attempts use, when they use one. Between attempts the wait then watches the channel connect
  // (and retries as soon as it has) instead of sleeping: gRPC advances a connection only while some thread polls,
  // and a process with no gRPC server of its own polls only inside calls, which fail at once while the channel is
  // down. A TLS handshake, which needs several reads, then never finished within its connect deadline.
  std::shared_ptr<grpc::Channel> channel;
};

// Calls `attempt` until it returns anything but UNAVAILABLE or `policy.give_up_after` has passed. The last
// UNAVAILABLE is returned with `what` and the time waited in its message.
[[nodiscard]] absl::Status RetryWhileUnavailable(const RetryPolicy& policy, std::string_view what,
                                                 const std::function<absl::Status()>& attempt);

// Splits "HOST:PORT" (or "[v6]:PORT"); INVALID_ARGUMENT naming the text otherwise.
// "host:port", with the host in brackets when it is an IPv6 address ("[::1]:80").
std::string JoinHostPort(const std::string& host, int port);

[[nodiscard]] absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_RPC_H_

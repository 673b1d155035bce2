// Whether a peer process is still there, asked of a TCP port it listens on without blocking.
//
// UCX's endpoints here do not watch their peer (no peer-failure mode, so that UCX may use shared memory), and
// with no connection manager between them nothing tells a worker that a server process died: its calls would
// wait out their deadlines. The fabric client probes the server's gRPC port instead while calls to it wait: a
// connection refused (or a host or network unreachable) means no process listens there any more; a
// connection made, or one still in progress, says nothing against the peer.
//
//   PortProbe probe(*ResolveHostPort("127.0.0.1:4000"));
//   // every tick, while calls wait:
//   if (std::optional<absl::Status> gone = probe.Poll(absl::Now(), absl::Milliseconds(500)); gone && !gone->ok()) ...
#ifndef TESSERA_COMMON_FABRIC_PORT_PROBE_H_
#define TESSERA_COMMON_FABRIC_PORT_PROBE_H_

#include <sys/socket.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

// A resolved TCP address.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};
// "HOST:PORT" resolved (blocking: name lookups). INVALID_ARGUMENT for an unparsable one, UNAVAILABLE when the
// host does not resolve.
[[nodiscard]] absl::StatusOr<SocketAddress> ResolveHostPort(const std::string& host_port);

// Not thread-safe: one thread polls it (the fabric client's progress thread).
class PortProbe {
 public:
  explicit PortProbe(SocketAddress address) : address_(address) {}
  ~PortProbe();
  PortProbe(const PortProbe&) = delete;
  PortProbe& operator=(const PortProbe&) = delete;

  // Starts a connection attempt unless one is in progress or the last one started less than `every` ago, and
  // returns the verdict of one that ended: OK (something accepted), UNAVAILABLE (refused or unreachable: the
  // peer is gone), or nullopt when none ended on this call. An attempt still in progress after `every` is
  // abandoned without a verdict (a slow network is not a dead peer). Never blocks.
  std::optional<absl::Status> Poll(absl::Time now, absl::Duration every);

 private:
  void Abandon();

  const SocketAddress address_;
  int fd_ = -1;            // the attempt in progress
  absl::Time started_ = absl::InfinitePast();
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FABRIC_PORT_PROBE_H_

// The front door of every listening port (gRPC and HTTP): accepts TCP connections itself and hands on only those
// that have said something, so that no flood of connections, of any size and from any number of hosts, can stop a
// listener or hold up the clients that talk.
//
//   auto acceptor = ConnectionAcceptor::Listen("127.0.0.1", 0, {}, [](int fd) { Serve(fd); /* owns fd now */ });
//   LOG(INFO) << "listening on port " << (*acceptor)->port();
//
// What it guarantees:
//  - The listener never stops: accept errors are retried, and when the process is out of descriptors (EMFILE,
//    ENFILE) a spare descriptor is given up to accept and close the waiting connection (gRPC's own listener, and
//    httplib's on some errors, stop for good there).
//  - A connection is handed on once its first bytes arrive (every protocol served here has the client speak
//    first: HTTP/2's preface, a TLS ClientHello, an HTTP request). Until then it waits in a bounded set with a
//    deadline; when the set is full the oldest waiting connection is closed, so a client that speaks at once
//    always gets through however many idle connections are held open.
//  - A connection is handed on only while the process keeps a reserve of descriptors below its limit (for the
//    connections already served, files, and gRPC's own needs); past that it is closed at once.
#ifndef TESSERA_COMMON_RPC_CONNECTION_ACCEPTOR_H_
#define TESSERA_COMMON_RPC_CONNECTION_ACCEPTOR_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

// Thread-safe: the hand-over runs on the acceptor's own thread.
class ConnectionAcceptor {
 public:
  struct Options {
    // Connections accepted but silent so far, at most (and at most a sixteenth of the descriptor limit); the
    // oldest is closed to make room.
    int max_silent = 256;
    // A connection silent for this long after its accept is closed.
    absl::Duration silent_timeout = absl::Seconds(5);
    // Descriptors kept free below the process's limit: max(min_free_descriptors, limit / 8). A connection that
    // would eat into them is closed at once.
    int64_t min_free_descriptors = 32;
  };
  // Takes a connected, non-blocking, close-on-exec socket and owns it from then on.
  using HandOver = std::function<void(int fd)>;

  // Binds host:port (0: a free port; no SO_REUSEPORT, so a port in use is an error) and starts accepting.
  // UNAVAILABLE naming the address when the bind fails; INVALID_ARGUMENT when the host is not an address.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> Listen(const std::string& host, int port,
                                                                                 const Options& options,
                                                                                 HandOver hand_over);
  // Stops accepting, closes the silent connections and the listening socket, and joins.
  ~ConnectionAcceptor();

  ConnectionAcceptor(const ConnectionAcceptor&) = delete;
  ConnectionAcceptor& operator=(const ConnectionAcceptor&) = delete;

  int port() const { return port_; }
  int listen_fd() const { return listen_fd_; }

  // Counters since the start, for tests and logs.
  int64_t handed_over() const { return handed_over_.load(); }
  int64_t closed_silent() const { return closed_silent_.load(); }
  int64_t refused_for_descriptors() const { return refused_for_descriptors_.load(); }

  // Raises this process's soft limit on open descriptors to its hard limit; returns the new soft limit.
  static int64_t RaiseDescriptorLimit();

 private:
  struct Silent {
    int fd;
    absl::Time deadline;
  };

  ConnectionAcceptor(int listen_fd, int port, const Options& options, HandOver hand_over);
  void Run();
  void AcceptAll();
  void CheckSilent();
  bool HaveDescriptorsToSpare();
  void NoteRefused();

  // Constant after construction.
  const int listen_fd_;
  const int port_;
  const Options options_;
  const HandOver hand_over_;
  int wake_fd_ = -1;   // an eventfd: written to stop the loop
  int spare_fd_ = -1;  // /dev/null, given up to accept a connection when out of descriptors

  // Only the acceptor's thread touches these.
  std::deque<Silent> silent_;
  int64_t open_estimate_ = 0;
  absl::Time open_counted_ = absl::InfinitePast();

  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> handed_over_{0}, closed_silent_{0}, refused_for_descriptors_{0};
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_CONNECTION_ACCEPTOR_H_

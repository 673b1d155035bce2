// A daemon's small HTTP face: /healthz, /metrics (Prometheus text format) and whatever else the role adds
// (the scheduler's /status). Served from a thread of its own, never from a gRPC thread.
//
//   auto http = HttpEndpoint::Start("127.0.0.1", 0, {{"/metrics", {"text/plain; version=0.0.4", [&] {
//     return store.MetricsText(); }}}});
//   LOG(INFO) << "metrics at http://127.0.0.1:" << (*http)->port() << "/metrics";
#ifndef TESSERA_COMMON_DAEMON_HTTP_ENDPOINT_H_
#define TESSERA_COMMON_DAEMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <atomic>

#include "absl/status/statusor.h"
#include "common/rpc/connection_acceptor.h"
#include "common/rpc/security.h"
#include "common/base/thread_pool.h"

struct ssl_ctx_st;

namespace tessera {

// Thread-safe. Handlers run on the endpoint's threads and must be thread-safe themselves.
class HttpEndpoint {
 public:
  struct Route {
    std::string content_type;
    std::function<std::string()> body;
    bool post = false;  // served to POST (an action) instead of GET; needs the job token when there is one
    // Instead of `body`, for an action that can fail: an error is answered with the HTTP status its code
    // stands for (FAILED_PRECONDITION 409, RESOURCE_EXHAUSTED 507, UNAVAILABLE 503, DEADLINE_EXCEEDED 504,
    // INVALID_ARGUMENT 400, others 500) and its message.
    // It gets the request's query parameters (`?server=1`: {"server": "1"}).
    std::function<absl::StatusOr<std::string>(const std::map<std::string, std::string>&)> action;
  };

  // Binds host:port (0: a free port) and serves `routes` plus /healthz ("ok"), over HTTPS when `security` has
  // TLS (its certificate; clients are not asked for one, so that probes and Prometheus can read). GET routes
  // are open; a POST needs "Authorization: Bearer TOKEN" when the job has a token (401 otherwise). One request
  // per connection. Connections are accepted by a ConnectionAcceptor (common/rpc/connection_acceptor.h); one thread
  // then reads every connection's TLS handshake and request headers at once (poll), and a request reaches one of
  // kThreads threads only once its headers are in; /healthz has a thread of its own. A request must arrive whole
  // (headers and body) within kRequestReadMs of its first bytes, and its headers within kMaxHeaderBytes; a client
  // that sends slower is cut off. So neither idle nor slow clients, however many, hold a thread or delay
  // /healthz. UNAVAILABLE when the bind fails; FAILED_PRECONDITION for plaintext beyond loopback without
  // --insecure.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& host, int port,
                                                                           const Security& security,
                                                                           std::map<std::string, Route> routes);
  static constexpr int kThreads = 8;
  // Requests whose headers are in and wait for a thread, at most; more are closed.
  static constexpr int kMaxQueued = 256;
  // The time a request (headers and body) has from its connection's first bytes, and its headers' size limit.
  static constexpr int kRequestReadMs = 3000;
  static constexpr size_t kMaxHeaderBytes = 16 << 10;
  // Connections whose headers are being read, at most; the oldest is closed to make room.
  static constexpr int kMaxReading = 1024;
  // Stops serving and joins.
  ~HttpEndpoint();

  int port() const { return acceptor_->port(); }

 private:
  class Routes;
  struct Request;
  class RequestReader;
  HttpEndpoint() = default;
  // From the reader: `request`'s headers are in; it goes to a thread (/healthz to its own), or is closed when
  // kMaxQueued wait.
  void Dispatch(std::unique_ptr<Request> request);
  // Serves the one request of `request` (blocking, within its deadline), then closes its connection.
  void Serve(Request& request);

  std::unique_ptr<Routes> routes_;
  std::shared_ptr<ssl_ctx_st> tls_;  // null without TLS
  std::atomic<int> queued_{0};
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ThreadPool> health_thread_;     // /healthz alone: never behind the others' requests
  std::unique_ptr<RequestReader> reader_;         // hands complete requests to the threads above
  std::unique_ptr<ConnectionAcceptor> acceptor_;  // last: stopped first
};

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_HTTP_ENDPOINT_H_

// A daemon's small HTTP face: /healthz, /metrics (Prometheus text format) and whatever else the role adds
// (the scheduler's /status). Served from a thread of its own, never from a gRPC thread.
//
//   auto http = HttpEndpoint::Start("127.0.0.1", 0, {{"/metrics", {"text/plain; version=0.0.4", [&] {
//     return store.MetricsText(); }}}});
//   LOG(INFO) << "metrics at http://127.0.0.1:" << (*http)->port() << "/metrics";
#ifndef TESSERA_COMMON_HTTP_ENDPOINT_H_
#define TESSERA_COMMON_HTTP_ENDPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <atomic>

#include "absl/status/statusor.h"
#include "common/connection_acceptor.h"
#include "common/security.h"
#include "common/thread_pool.h"

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
  // per connection. Connections are accepted by a ConnectionAcceptor (common/connection_acceptor.h) and reach
  // one of kThreads threads only once the client has sent something, so idle connections, however many, hold
  // no thread and never delay /healthz; a client that then stalls is cut off after a second. UNAVAILABLE when
  // the bind fails; FAILED_PRECONDITION for plaintext beyond loopback without --insecure.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& host, int port,
                                                                           const Security& security,
                                                                           std::map<std::string, Route> routes);
  static constexpr int kThreads = 8;
  // Connections that spoke and wait for a thread, at most; more are closed.
  static constexpr int kMaxQueued = 256;
  // Stops serving and joins.
  ~HttpEndpoint();

  int port() const { return acceptor_->port(); }

 private:
  class Routes;
  HttpEndpoint() = default;
  // Serves the one request of connection `fd` (blocking, with timeouts), then closes it.
  void ServeConnection(int fd);

  std::unique_ptr<Routes> routes_;
  std::shared_ptr<ssl_ctx_st> tls_;  // null without TLS
  std::atomic<int> queued_{0};
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ConnectionAcceptor> acceptor_;  // last: stopped first
};

}  // namespace tessera

#endif  // TESSERA_COMMON_HTTP_ENDPOINT_H_

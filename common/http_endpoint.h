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
#include <thread>

#include "absl/status/statusor.h"
#include "common/security.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tessera {

// Thread-safe. Handlers run on the endpoint's threads and must be thread-safe themselves.
class HttpEndpoint {
 public:
  struct Route {
    std::string content_type;
    std::function<std::string()> body;
    bool post = false;  // served to POST (an action) instead of GET; needs the job token when there is one
  };

  // Binds host:port (0: a free port) and serves `routes` plus /healthz ("ok"), over HTTPS when `security` has
  // TLS (its certificate; clients are not asked for one, so that probes and Prometheus can read). GET routes
  // are open; a POST needs "Authorization: Bearer TOKEN" when the job has a token (401 otherwise). Requests are
  // served by kThreads threads; a connection idle for a second is closed, so idle clients cannot starve
  // /healthz. UNAVAILABLE when the bind fails; FAILED_PRECONDITION for plaintext beyond loopback without
  // --insecure.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& host, int port,
                                                                           const Security& security,
                                                                           std::map<std::string, Route> routes);
  static constexpr int kThreads = 32;
  // Stops serving and joins.
  ~HttpEndpoint();

  int port() const { return port_; }

 private:
  HttpEndpoint() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_HTTP_ENDPOINT_H_

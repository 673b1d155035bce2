#include "common/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& host, int port,
                                                                  const Security& security,
                                                                  std::map<std::string, Route> routes) {
  if (absl::Status s = security.CheckListenHost(host, "HTTP"); !s.ok()) return s;
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  if (security.tls()) {
    auto tls = std::make_unique<httplib::SSLServer>(security.cert_file().c_str(), security.key_file().c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("HTTPS on ", host, ": cannot use the certificate ",
                                                     security.cert_file(), " with the key ", security.key_file()));
    }
    endpoint->server_ = std::move(tls);
  } else {
    endpoint->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& routes_server = *endpoint->server_;
  routes_server.new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  routes_server.set_keep_alive_timeout(1);
  routes_server.set_read_timeout(1, 0);
  routes_server.set_write_timeout(5, 0);
  routes["/healthz"] = Route{"text/plain", [] { return std::string("ok\n"); }};
  auto guard = std::make_shared<const Security>(security);  // the handlers' own copy
  for (const auto& entry : routes) {
    const Route route = entry.second;  // a copy the handler owns (structured bindings cannot be captured in C++17)
    auto handler = [route, guard](const httplib::Request& request, httplib::Response& response) {
      if (route.post) {
        if (absl::Status s = guard->AuthenticateHeader(request.get_header_value("Authorization")); !s.ok()) {
          response.status = 401;
          response.set_content(absl::StrCat(s.message(), "\n"), "text/plain");
          return;
        }
      }
      response.set_content(route.body(), route.content_type.c_str());
    };
    if (route.post) {
      endpoint->server_->Post(entry.first, handler);
    } else {
      endpoint->server_->Get(entry.first, handler);
    }
  }
  endpoint->port_ = port == 0 ? endpoint->server_->bind_to_any_port(host.c_str())
                              : (endpoint->server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", host, ":", port));
  }
  httplib::Server* server = endpoint->server_.get();
  endpoint->thread_ = std::thread([server] { server->listen_after_bind(); });
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera

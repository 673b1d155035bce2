#include "common/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace tessera {

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& host, int port,
                                                                  std::map<std::string, Route> routes) {
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  endpoint->server_ = std::make_unique<httplib::Server>();
  routes["/healthz"] = Route{"text/plain", [] { return std::string("ok\n"); }};
  for (const auto& entry : routes) {
    const Route route = entry.second;  // a copy the handler owns (structured bindings cannot be captured in C++17)
    auto handler = [route](const httplib::Request&, httplib::Response& response) {
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

std::string PrometheusMetric(const std::string& name, const std::string& kind, double value,
                             const std::string& labels) {
  return absl::StrCat("# TYPE ", name, " ", kind, "\n", name, labels.empty() ? "" : absl::StrCat("{", labels, "}"),
                      " ", value, "\n");
}

}  // namespace tessera

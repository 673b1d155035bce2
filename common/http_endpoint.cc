#include "common/http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {
namespace {

constexpr int kReadTimeoutMs = 1000;   // a client that stalls mid-request is cut off after this long
constexpr int kWriteTimeoutMs = 5000;  // and one that does not read its answer after this long

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p = {fd, events, 0};
  return poll(&p, 1, timeout_ms) == 1 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

void Address(int fd, bool remote, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  const int got = remote ? getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length)
                         : getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0) return;
  char text[INET6_ADDRSTRLEN] = {0};
  if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  } else {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  }
  ip = text;
}

// One connection as httplib reads and writes it: a non-blocking socket, or TLS over it, with deadlines.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, SSL* tls) : fd_(fd), tls_(tls) {}

  bool is_readable() const override {
    return (tls_ != nullptr && SSL_pending(tls_) > 0) || WaitFor(fd_, POLLIN, kReadTimeoutMs);
  }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, kWriteTimeoutMs); }

  ssize_t read(char* ptr, size_t size) override {
    for (;;) {
      if (tls_ == nullptr) {
        const ssize_t n = recv(fd_, ptr, size, 0);
        if (n >= 0 || (errno != EAGAIN && errno != EINTR)) return n;
        if (!WaitFor(fd_, POLLIN, kReadTimeoutMs)) return -1;
        continue;
      }
      const int n = SSL_read(tls_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n > 0) return n;
      if (!WaitForTls(n)) return n == 0 ? 0 : -1;
    }
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t written = 0;
    while (written < size) {
      if (tls_ == nullptr) {
        const ssize_t n = send(fd_, ptr + written, size - written, MSG_NOSIGNAL);
        if (n > 0) {
          written += n;
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR) && WaitFor(fd_, POLLOUT, kWriteTimeoutMs)) continue;
        return -1;
      }
      const int n = SSL_write(tls_, ptr + written, static_cast<int>(std::min<size_t>(size - written, 1 << 30)));
      if (n > 0) {
        written += n;
        continue;
      }
      if (!WaitForTls(n)) return -1;
    }
    return static_cast<ssize_t>(written);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  // After an SSL call returned `result` <= 0: waits for what it wants; false when it failed for good.
  bool WaitForTls(int result) const {
    switch (SSL_get_error(tls_, result)) {
      case SSL_ERROR_WANT_READ:
        return WaitFor(fd_, POLLIN, kReadTimeoutMs);
      case SSL_ERROR_WANT_WRITE:
        return WaitFor(fd_, POLLOUT, kWriteTimeoutMs);
      default:
        ERR_clear_error();
        return false;
    }
  }

 private:
  const int fd_;
  SSL* const tls_;  // not owned; null for plaintext
};

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 507;  // Insufficient Storage: a full disk, the usual cause here
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

}  // namespace

// httplib's router, fed one request at a time from connections Tessera accepted itself.
class HttpEndpoint::Routes : public httplib::Server {
 public:
  using httplib::Server::process_request;
};

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& host, int port,
                                                                  const Security& security,
                                                                  std::map<std::string, Route> routes) {
  if (absl::Status s = security.CheckListenHost(host, "HTTP"); !s.ok()) return s;
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  if (security.tls()) {
    std::shared_ptr<SSL_CTX> tls(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
    if (tls == nullptr ||
        SSL_CTX_use_certificate_chain_file(tls.get(), security.cert_file().c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(tls.get(), security.key_file().c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(tls.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("HTTPS on ", host, ": cannot use the certificate ",
                                                     security.cert_file(), " with the key ", security.key_file()));
    }
    SSL_CTX_set_min_proto_version(tls.get(), TLS1_2_VERSION);
    endpoint->tls_ = std::move(tls);
  }
  endpoint->routes_ = std::make_unique<Routes>();
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
      if (!route.action) {
        response.set_content(route.body(), route.content_type.c_str());
        return;
      }
      std::map<std::string, std::string> query;
      for (const auto& [key, value] : request.params) query.emplace(key, value);
      absl::StatusOr<std::string> done = route.action(query);
      if (done.ok()) {
        response.set_content(*done, route.content_type.c_str());
        return;
      }
      response.status = HttpStatusOf(done.status().code());
      response.set_content(absl::StrCat(done.status().ToString(), "\n"), "text/plain");
    };
    if (route.post) {
      endpoint->routes_->Post(entry.first, handler);
    } else {
      endpoint->routes_->Get(entry.first, handler);
    }
  }
  endpoint->threads_ = std::make_unique<ThreadPool>(kThreads);
  HttpEndpoint* self = endpoint.get();
  absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> acceptor =
      ConnectionAcceptor::Listen(host, port, {}, [self](int fd) {
        if (self->queued_.load() >= kMaxQueued) {
          close(fd);  // every thread is busy with clients that spoke and a full queue waits: shed load
          return;
        }
        ++self->queued_;
        self->threads_->Submit([self, fd] {
          --self->queued_;
          self->ServeConnection(fd);
        });
      });
  if (!acceptor.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", host, ":", port, ": ",
                                               acceptor.status().message()));
  }
  endpoint->acceptor_ = std::move(*acceptor);
  return endpoint;
}

void HttpEndpoint::ServeConnection(int fd) {
  if (stopping_) {
    close(fd);
    return;
  }
  std::unique_ptr<SSL, decltype(&SSL_free)> tls(nullptr, SSL_free);
  if (tls_ != nullptr) {
    tls.reset(SSL_new(tls_.get()));
    if (tls == nullptr || SSL_set_fd(tls.get(), fd) != 1) {
      ERR_clear_error();
      close(fd);
      return;
    }
    ConnectionStream handshake(fd, tls.get());
    for (;;) {
      const int done = SSL_accept(tls.get());
      if (done == 1) break;
      if (!handshake.WaitForTls(done)) {
        close(fd);
        return;
      }
    }
  }
  ConnectionStream stream(fd, tls.get());
  bool closed = false;
  routes_->process_request(stream, /*close_connection=*/true, closed, [](httplib::Request&) {});
  if (tls != nullptr) SSL_shutdown(tls.get());
  close(fd);
}

HttpEndpoint::~HttpEndpoint() {
  stopping_ = true;
  acceptor_.reset();  // no new connections
  threads_.reset();   // queued ones are closed unserved; those being served finish within their timeouts
}

}  // namespace tessera

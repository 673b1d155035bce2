#include "common/daemon/http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace tessera {
namespace {

constexpr int kWriteTimeoutMs = 5000;  // a client that does not read its answer is cut off after this long

// Milliseconds from now to `deadline`, at least 0 and at most a second (a poll's timeout).
int MillisecondsUntil(absl::Time deadline) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0, 1000));
}

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

// One connection as httplib reads and writes it: the bytes read before (`received`), then a non-blocking socket,
// or TLS over it; reading ends at the request's `deadline`, each write within kWriteTimeoutMs.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int fd, SSL* tls, std::string received, absl::Time deadline)
      : fd_(fd), tls_(tls), received_(std::move(received)), deadline_(deadline) {}

  bool is_readable() const override {
    return offset_ < received_.size() || (tls_ != nullptr && SSL_pending(tls_) > 0) || WaitToRead();
  }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, kWriteTimeoutMs); }

  ssize_t read(char* ptr, size_t size) override {
    if (offset_ < received_.size()) {
      const size_t n = std::min(size, received_.size() - offset_);
      std::copy_n(received_.data() + offset_, n, ptr);
      offset_ += n;
      return static_cast<ssize_t>(n);
    }
    for (;;) {
      if (tls_ == nullptr) {
        const ssize_t n = recv(fd_, ptr, size, 0);
        if (n >= 0 || (errno != EAGAIN && errno != EINTR)) return n;
        if (!WaitToRead()) return -1;
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

  // Waits for bytes to read until the request's deadline; false when it passed first.
  bool WaitToRead() const {
    while (absl::Now() < deadline_) {
      if (WaitFor(fd_, POLLIN, MillisecondsUntil(deadline_))) return true;
    }
    return false;
  }

  // After an SSL call returned `result` <= 0: waits for what it wants; false when it failed for good.
  bool WaitForTls(int result) const {
    switch (SSL_get_error(tls_, result)) {
      case SSL_ERROR_WANT_READ:
        return WaitToRead();
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
  const std::string received_;
  size_t offset_ = 0;  // of received_, handed to httplib so far
  const absl::Time deadline_;
};

// Whether `received` holds a request's whole header section (it ends with an empty line).
bool HeadersIn(const std::string& received) {
  return received.find("\r\n\r\n") != std::string::npos || received.find("\n\n") != std::string::npos;
}

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

// A connection whose request is being read: its socket (closed with it), TLS over it, and what came so far.
struct HttpEndpoint::Request {
  explicit Request(int fd, absl::Time deadline) : fd(fd), deadline(deadline) {}
  ~Request() { close(fd); }

  const int fd;
  const absl::Time deadline;  // for the whole request (kRequestReadMs from its first bytes)
  std::unique_ptr<SSL, decltype(&SSL_free)> tls{nullptr, SSL_free};
  bool handshaken = false;  // TLS: the handshake is done
  bool wants_write = false;  // TLS: the next step waits for the socket to take bytes
  std::string received;     // the request's bytes so far (decrypted)
};

// Reads the handshakes and request headers of every connection at once on one thread (poll), so that a slow
// client holds a buffer, not a thread; hands on those whose headers are in. Thread-safe.
class HttpEndpoint::RequestReader {
 public:
  RequestReader(SSL_CTX* tls, std::function<void(std::unique_ptr<Request>)> complete)
      : tls_(tls), complete_(std::move(complete)) {
    if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Run(); });
  }
  // Stops, closing the connections still being read.
  ~RequestReader() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
    for (int fd : incoming_) close(fd);
    for (int fd : wake_) {
      if (fd >= 0) close(fd);
    }
  }

  // Takes connection `fd` (non-blocking), which has bytes to read.
  void Add(int fd) {
    {
      absl::MutexLock lock(&mu_);
      incoming_.push_back(fd);
    }
    Wake();
  }

 private:
  void Wake() {
    const char byte = 1;
    if (wake_[1] >= 0 && write(wake_[1], &byte, 1) < 0) VLOG(2) << "HTTP reader: the wake pipe is full";
  }
  bool TakeIncoming(std::vector<std::unique_ptr<Request>>& reading);
  void Run();
  // Reads what `r` has for it: true once its headers are in; an error when it must be closed.
  absl::StatusOr<bool> Advance(Request& r);

  SSL_CTX* const tls_;  // not owned; null for plaintext
  const std::function<void(std::unique_ptr<Request>)> complete_;
  int wake_[2] = {-1, -1};
  absl::Mutex mu_;
  std::vector<int> incoming_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

bool HttpEndpoint::RequestReader::TakeIncoming(std::vector<std::unique_ptr<Request>>& reading) {
  std::vector<int> fds;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    fds.swap(incoming_);
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(kRequestReadMs);
  for (int fd : fds) {
    auto r = std::make_unique<Request>(fd, deadline);
    if (tls_ != nullptr) {
      r->tls.reset(SSL_new(tls_));
      if (r->tls == nullptr || SSL_set_fd(r->tls.get(), fd) != 1) {
        ERR_clear_error();
        continue;  // closed with r
      }
    }
    reading.push_back(std::move(r));
  }
  // The oldest make room: a client that keeps its connection slow loses it first.
  if (reading.size() > static_cast<size_t>(kMaxReading)) reading.erase(reading.begin(), reading.end() - kMaxReading);
  return true;
}

void HttpEndpoint::RequestReader::Run() {
  std::vector<std::unique_ptr<Request>> reading;
  std::vector<pollfd> polled;
  while (TakeIncoming(reading)) {
    polled.assign(1, pollfd{wake_[0], POLLIN, 0});
    absl::Time next = absl::Now() + absl::Seconds(1);
    for (const auto& r : reading) {
      polled.push_back(pollfd{r->fd, static_cast<short>(r->wants_write ? POLLOUT : POLLIN), 0});
      next = std::min(next, r->deadline);
    }
    poll(polled.data(), polled.size(), MillisecondsUntil(next));
    char drain[64];
    while (read(wake_[0], drain, sizeof(drain)) > 0) {
    }
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < reading.size(); ++i) {
      std::unique_ptr<Request>& r = reading[i];
      if (polled[i + 1].revents != 0) {
        absl::StatusOr<bool> in = Advance(*r);
        if (in.ok() && *in) {
          complete_(std::move(r));
          continue;
        }
        if (!in.ok()) {
          VLOG(1) << "HTTP: " << in.status();
          r.reset();
          continue;
        }
      }
      if (now >= r->deadline) r.reset();  // too slow: cut off
    }
    reading.erase(std::remove(reading.begin(), reading.end(), nullptr), reading.end());
  }
}

absl::StatusOr<bool> HttpEndpoint::RequestReader::Advance(Request& r) {
  r.wants_write = false;
  if (r.tls != nullptr && !r.handshaken) {
    const int done = SSL_accept(r.tls.get());
    if (done != 1) {
      const int error = SSL_get_error(r.tls.get(), done);
      ERR_clear_error();
      if (error == SSL_ERROR_WANT_READ) return false;
      if (error == SSL_ERROR_WANT_WRITE) {
        r.wants_write = true;
        return false;
      }
      return absl::UnavailableError("a TLS handshake failed");
    }
    r.handshaken = true;
  }
  char buffer[4096];
  for (;;) {
    ssize_t n;
    if (r.tls == nullptr) {
      n = recv(r.fd, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    } else {
      n = SSL_read(r.tls.get(), buffer, sizeof(buffer));
      if (n <= 0) {
        const int error = SSL_get_error(r.tls.get(), static_cast<int>(n));
        ERR_clear_error();
        if (error == SSL_ERROR_WANT_READ) break;
        r.wants_write = error == SSL_ERROR_WANT_WRITE;
        if (r.wants_write) break;
      }
    }
    if (n <= 0) return absl::UnavailableError("a client closed its connection before its request was in");
    r.received.append(buffer, static_cast<size_t>(n));
    if (HeadersIn(r.received)) return true;
    if (r.received.size() > kMaxHeaderBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("request headers over ", kMaxHeaderBytes, " bytes"));
    }
  }
  return HeadersIn(r.received);
}

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
  endpoint->health_thread_ = std::make_unique<ThreadPool>(1);
  HttpEndpoint* self = endpoint.get();
  endpoint->reader_ = std::make_unique<RequestReader>(
      endpoint->tls_.get(), [self](std::unique_ptr<Request> request) { self->Dispatch(std::move(request)); });
  absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> acceptor =
      ConnectionAcceptor::Listen(host, port, {}, [self](int fd) { self->reader_->Add(fd); });
  if (!acceptor.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", host, ":", port, ": ",
                                               acceptor.status().message()));
  }
  endpoint->acceptor_ = std::move(*acceptor);
  return endpoint;
}

void HttpEndpoint::Dispatch(std::unique_ptr<Request> request) {
  if (queued_.load() >= kMaxQueued) return;  // every thread is busy and a full queue waits: shed load (closed)
  ++queued_;
  const bool health = absl::StartsWith(request->received, "GET /healthz ") ||
                      absl::StartsWith(request->received, "GET /healthz?");
  // (A std::function must be copyable: the request travels shared; a task dropped unrun still closes it.)
  std::shared_ptr<Request> shared = std::move(request);
  (health ? health_thread_ : threads_)->Submit([this, shared] {
    --queued_;
    Serve(*shared);
  });
}

void HttpEndpoint::Serve(Request& request) {
  if (stopping_) return;  // closed with the request
  ConnectionStream stream(request.fd, request.tls.get(), std::move(request.received), request.deadline);
  bool closed = false;
  routes_->process_request(stream, /*close_connection=*/true, closed, [](httplib::Request&) {});
  if (request.tls != nullptr) SSL_shutdown(request.tls.get());
}

HttpEndpoint::~HttpEndpoint() {
  stopping_ = true;
  acceptor_.reset();       // no new connections
  reader_.reset();         // nor requests; those being read are closed
  health_thread_.reset();  // queued ones are closed unserved; those being served finish within their timeouts
  threads_.reset();
}

}  // namespace tessera

#include "common/fabric/port_probe.h"

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rpc/rpc.h"

namespace tessera {

absl::StatusOr<SocketAddress> ResolveHostPort(const std::string& host_port) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(host_port, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "' of ", host_port, ": ", gai_strerror(rc)));
  }
  SocketAddress out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

PortProbe::~PortProbe() { Abandon(); }

void PortProbe::Abandon() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

namespace {

// A connection's outcome as a verdict on its peer.
absl::Status Verdict(int error) {
  if (error == ECONNREFUSED || error == EHOSTUNREACH || error == ENETUNREACH) {
    return absl::UnavailableError(absl::StrCat("nothing listens there any more (", std::strerror(error), ")"));
  }
  return absl::OkStatus();  // accepted, or failed in a way that says nothing about the peer
}

}  // namespace

std::optional<absl::Status> PortProbe::Poll(absl::Time now, absl::Duration every) {
  if (fd_ >= 0) {
    pollfd p{fd_, POLLOUT, 0};
    if (poll(&p, 1, 0) == 1) {
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length);
      Abandon();
      return Verdict(error);
    }
    if (now - started_ >= every) Abandon();
    return std::nullopt;
  }
  if (now - started_ < every) return std::nullopt;
  started_ = now;
  fd_ = socket(address_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return std::nullopt;  // out of descriptors: no verdict
  if (connect(fd_, address_.get(), address_.length) == 0) {
    Abandon();
    return absl::OkStatus();
  }
  const int error = errno;
  if (error == EINPROGRESS) return std::nullopt;
  Abandon();
  return Verdict(error);
}

}  // namespace tessera

#include "common/rpc/connection_acceptor.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {
namespace {

// Closes with a reset rather than a FIN: nothing is owed to a connection refused or dropped here, and a reset
// frees the socket at once instead of leaving it in TIME_WAIT.
void Drop(int fd) {
  linger hard = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  close(fd);
}

int64_t CountOpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int64_t n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n - 3;  // ".", ".." and the directory's own descriptor
}

int64_t DescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return int64_t{1} << 20;
  return static_cast<int64_t>(limit.rlim_cur);
}

}  // namespace

int64_t ConnectionAcceptor::RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) PLOG(WARNING) << "cannot raise the open-descriptor limit";
  }
  return DescriptorLimit();
}

absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ConnectionAcceptor::Listen(const std::string& host, int port,
                                                                             const Options& options,
                                                                             HandOver hand_over) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); e != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on '", host, "': ", gai_strerror(e)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  std::string last_error = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = strerror(errno);
      continue;
    }
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));  // a restarted daemon rebinds its port at once
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_error = errno == EADDRINUSE ? absl::StrCat("port ", port, " is in use")
                                       : absl::StrCat(strerror(errno), " (is the host one of this machine's?)");
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    const int bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    std::unique_ptr<ConnectionAcceptor> acceptor(new ConnectionAcceptor(fd, bound_port, options, std::move(hand_over)));
    acceptor->thread_ = std::thread([self = acceptor.get()] { self->Run(); });
    return acceptor;
  }
  return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, ": ", last_error));
}

ConnectionAcceptor::ConnectionAcceptor(int listen_fd, int port, const Options& options, HandOver hand_over)
    : listen_fd_(listen_fd), port_(port), options_(options), hand_over_(std::move(hand_over)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

ConnectionAcceptor::~ConnectionAcceptor() {
  stopping_ = true;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) PLOG(WARNING) << "cannot wake the acceptor";
  if (thread_.joinable()) thread_.join();
  for (const Silent& s : silent_) Drop(s.fd);
  close(listen_fd_);
  close(wake_fd_);
  if (spare_fd_ >= 0) close(spare_fd_);
}

void ConnectionAcceptor::Run() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Silent& s : silent_) fds.push_back({s.fd, POLLIN, 0});
    absl::Duration wait = absl::Seconds(1);
    const absl::Time now = absl::Now();
    if (!silent_.empty()) wait = std::clamp(silent_.front().deadline - now, absl::ZeroDuration(), wait);
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    if (ready < 0 && errno != EINTR) {
      PLOG(ERROR) << "acceptor on port " << port_ << ": poll failed";
      absl::SleepFor(absl::Milliseconds(10));  // a pause before polling again, not a synchronisation point
      continue;
    }
    if (stopping_) break;
    // Silent connections that spoke (or hung up) first, in the order of `fds` (the deque is unchanged until here).
    std::deque<Silent> still_silent;
    for (size_t i = 0; i < silent_.size(); ++i) {
      const short revents = fds[i + 2].revents;
      if (revents == 0) {
        still_silent.push_back(silent_[i]);
        continue;
      }
      char byte;
      if ((revents & POLLIN) == 0 || recv(silent_[i].fd, &byte, 1, MSG_PEEK) != 1) {
        Drop(silent_[i].fd);  // hung up or failed
      } else if (!HaveDescriptorsToSpare()) {
        NoteRefused();
        Drop(silent_[i].fd);
      } else {
        ++handed_over_;
        hand_over_(silent_[i].fd);
      }
    }
    silent_ = std::move(still_silent);
    if ((fds[1].revents & POLLIN) != 0) AcceptAll();
    CheckSilent();
  }
}

void ConnectionAcceptor::AcceptAll() {
  // Silent connections count against the process's descriptors, which every listener of it shares: each keeps
  // at most a sixteenth of the limit, so that silent ones alone never bring the process near it.
  const int max_silent =
      static_cast<int>(std::min<int64_t>(options_.max_silent, std::max<int64_t>(4, DescriptorLimit() / 16)));
  // A bounded batch per turn, so that silent connections that spoke are served between batches.
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      const int on = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      ++open_estimate_;
      char byte;
      const ssize_t peeked = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        Drop(fd);  // came and went
        continue;
      }
      if (!HaveDescriptorsToSpare()) {
        NoteRefused();
        Drop(fd);
        continue;
      }
      if (peeked == 1) {  // the client spoke already (the usual case for a real one): served at once
        ++handed_over_;
        hand_over_(fd);
        continue;
      }
      if (static_cast<int>(silent_.size()) >= max_silent) {
        Drop(silent_.front().fd);  // the oldest silent connection makes room
        silent_.pop_front();
        ++closed_silent_;
      }
      silent_.push_back({fd, absl::Now() + options_.silent_timeout});
      continue;
    }
    switch (errno) {
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case EPERM:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        continue;  // that connection is gone; the listener is fine
      case EMFILE:
      case ENFILE:
      case ENOBUFS:
      case ENOMEM: {
        // Out of descriptors or memory: give up the spare descriptor to take the waiting connection off the
        // queue and close it, so that the listener is not woken for it again and again.
        NoteRefused();
        if (spare_fd_ >= 0) {
          close(spare_fd_);
          const int victim = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (victim >= 0) Drop(victim);
          spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        return;
      }
      default:
        return;  // EAGAIN: nothing more waiting
    }
  }
}

void ConnectionAcceptor::CheckSilent() {
  const absl::Time now = absl::Now();
  while (!silent_.empty() && silent_.front().deadline <= now) {
    Drop(silent_.front().fd);
    silent_.pop_front();
    ++closed_silent_;
  }
}

bool ConnectionAcceptor::HaveDescriptorsToSpare() {
  const int64_t limit = DescriptorLimit();
  const int64_t reserve = std::max(options_.min_free_descriptors, limit / 8);
  const absl::Time now = absl::Now();
  // Counting /proc/self/fd costs a directory read: done at most every 100 ms while far from the line (the estimate
  // counts only this acceptor's own connections), and for every connection near it.
  if (now - open_counted_ > absl::Milliseconds(100) || open_estimate_ + 2 * reserve >= limit) {
    open_estimate_ = CountOpenDescriptors();
    open_counted_ = now;
  }
  return open_estimate_ + reserve < limit;
}

void ConnectionAcceptor::NoteRefused() {
  // The first refusal and every 1000th after it are logged (a flood refuses many).
  if (refused_for_descriptors_++ % 1000 != 0) return;
  LOG(WARNING) << "port " << port_ << ": " << open_estimate_ << " of " << DescriptorLimit()
               << " descriptors open; refusing new connections until some close";
}

}  // namespace tessera

// Loopback ports for tests: one nobody listens on (bound and released by the OS), for "no scheduler answers"
// tests; one a socket listens on but nobody accepts from, for "a peer that froze" tests.
#ifndef TESSERA_TESTS_TESTING_PORTS_H_
#define TESSERA_TESTS_TESTING_PORTS_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera::testing {

// A socket bound to a free loopback port (listening when `listening`); its port in `*port`. The caller closes it.
inline int BoundLoopbackSocket(int* port, bool listening) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (listening) listen(fd, 16);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

inline int UnusedLoopbackPort() {
  int port = 0;
  close(BoundLoopbackSocket(&port, /*listening=*/false));
  return port;
}

// Connections to it complete (the kernel accepts them into the backlog) and then nothing is ever answered.
inline int ListeningLoopbackSocket(int* port) { return BoundLoopbackSocket(port, /*listening=*/true); }

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_PORTS_H_

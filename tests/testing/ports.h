// A loopback port nobody listens on (bound and released by the OS), for "no scheduler answers" tests.
#ifndef TESSERA_TESTS_TESTING_PORTS_H_
#define TESSERA_TESTS_TESTING_PORTS_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tessera::testing {

inline int UnusedLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_PORTS_H_

#include "launch/ports.h"

#include <cstdint>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace zero::launch {

int bind_any(int family, int port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (family == AF_INET6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

int port_unavailable(int port) {
  for (int family : {AF_INET, AF_INET6}) {
    int fd = bind_any(family, port);
    if (fd < 0) {
      if (family == AF_INET6 && (errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL)) continue;  // no IPv6 here
      return errno;
    }
    close(fd);
  }
  return 0;
}

int pick_free_port() {
  int fd = bind_any(AF_INET, 0);
  const int err = errno;
  const int port = fd >= 0 ? local_port(fd) : -1;
  if (fd >= 0) close(fd);
  if (port <= 0) throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(err));
  return port;
}

}  // namespace zero::launch

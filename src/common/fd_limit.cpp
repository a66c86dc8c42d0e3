#include "common/fd_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

namespace zero {

namespace {
long soft_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  return r.rlim_cur == RLIM_INFINITY ? -1 : static_cast<long>(r.rlim_cur);
}
}  // namespace

long raise_fd_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);  // a failure leaves the limit as it was, which is all it can do
  }
  return soft_limit();
}

bool is_fd_shortage(int err) { return err == EMFILE || err == ENFILE; }

std::string out_of_descriptors(const std::string& what, int err) {
  const long limit = soft_limit();
  return "out of file descriptors (" + std::string(err == ENFILE ? "the system's table is full; " : "") +
         "ulimit -n " + (limit < 0 ? std::string("unlimited") : std::to_string(limit)) + "): " + what + ": " +
         std::strerror(err) + " -- raise the limit (ulimit -n, or the hard limit: it caps what zero-cpp raises to)";
}

}  // namespace zero

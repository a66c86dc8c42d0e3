#include "comm/shm/process_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

namespace zero::comm::shm {

ProcessWatch::~ProcessWatch() { close_pidfd(); }

void ProcessWatch::close_pidfd() {
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
  pidfd_tried_ = false;
}

bool ProcessWatch::exited(pid_t pid) {
  if (pid <= 0) return false;
  if (pid != pid_) {
    close_pidfd();
    pid_ = pid;
  }
  if (!pidfd_tried_) {
    pidfd_tried_ = true;
    const long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) pidfd_ = static_cast<int>(fd);
    else if (errno == ESRCH) return true;  // gone and reaped already
    // else (ENOSYS, EMFILE, ...): kill(pid, 0) below, which needs no descriptor
  }
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);  // readable once the process has exited
  }
  return kill(pid, 0) != 0 && errno == ESRCH;  // EPERM: alive, another user's
}

}  // namespace zero::comm::shm

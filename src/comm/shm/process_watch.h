// Whether a peer process has exited: asked every ~100 ms by a lane that
// waits on it (comm/shm/lane.h), so that a dead rank is an error naming it
// rather than a wait until the collective timeout.
//
// A pidfd (Linux 5.3+), opened at the first question and kept, sees the
// exit at once -- also while the process is a zombie its parent has not yet
// reaped. Without one (an older kernel, or no descriptor to be had: the
// process is at its limit), kill(pid, 0) sees it once the process is
// reaped. Neither opens anything per question, and a failure to open is
// never read as an exit: a rank short of descriptors does not take a live
// peer for dead. No torch.
#pragma once

#include <sys/types.h>

namespace zero::comm::shm {

class ProcessWatch {
 public:
  ProcessWatch() = default;
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // Whether process `pid` (of this PID namespace) has exited. A watch
  // follows one process: asked about another pid, it starts over.
  bool exited(pid_t pid);

 private:
  void close_pidfd();
  pid_t pid_ = 0;
  int pidfd_ = -1;
  bool pidfd_tried_ = false;
};

}  // namespace zero::comm::shm

// The process's limit on open descriptors (RLIMIT_NOFILE). A rank needs a
// few dozen -- its sockets, one memfd for all its shared flat buffers
// (memory/shared_arena.h), a pidfd per same-host peer
// (comm/shm/process_watch.h) -- but the program around it may need many
// more, and the common default soft limit (1024) is far below the usual
// hard one: raise_fd_limit() lifts the soft limit to the hard one, once, at
// init_distributed, as many runtimes do. Where a descriptor still cannot be
// had, the error says so (out_of_descriptors) instead of naming whatever
// the missing descriptor was for. No torch.
#pragma once

#include <string>

namespace zero {

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit
// now in force.
long raise_fd_limit();

// Whether errno `err` means no descriptor was to be had (EMFILE: this
// process's limit; ENFILE: the system's).
bool is_fd_shortage(int err);

// "out of file descriptors (ulimit -n N): <what>: <strerror(err)>", with the
// advice to raise the limit.
std::string out_of_descriptors(const std::string& what, int err);

}  // namespace zero

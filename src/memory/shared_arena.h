// This process's shared memory for flat buffers: one memfd, from which every
// shared flat buffer (memory/page_buffer.h) takes a page-aligned range and
// maps it. One descriptor however many buffers (a memfd per buffer ran a
// rank with hundreds of units out of descriptors); a peer finds a buffer by
// (pid, descriptor, inode, range) and maps only that range
// (comm/shm/peer_buffers.h).
//
// A freed range has its pages punched out -- they go back to the OS at
// once, and a peer's cached mapping of the range holds nothing -- and is
// reused for the next buffer of the same size, which a peer's cached
// mapping then serves as well. The memfd only grows (sparse: only pages
// written hold memory) and is never truncated, so a peer reading a range
// reads zeros at worst, never SIGBUS. A process forked from a rank starts an
// arena of its own at its first shared buffer (the inherited ranges stay the
// parent's). No torch.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace zero::memory {

struct SharedRange {
  char* ptr = nullptr;  // mapped here, read-write
  size_t bytes = 0;     // page-rounded
  int64_t offset = 0;   // in the memfd
  int fd = -1;          // the memfd (the arena's; not to be closed)
  uint64_t inode = 0;
  pid_t owner = 0;      // the process whose arena it is
};

// A zero-filled range of at least `bytes`, or nullopt where this system
// offers no memfd (the buffer is then private and its collectives staged).
// Throws std::runtime_error when no descriptor can be had for the memfd
// (naming the limit) or the memory cannot be mapped.
std::optional<SharedRange> map_shared_range(size_t bytes);

// Unmaps `r` and, in its owner, frees its pages and lets the range be reused.
void free_shared_range(const SharedRange& r);

// Frees `r`'s pages, keeping the mapping (they read as zeros); false with
// errno on failure.
bool punch_shared_range(const SharedRange& r);

}  // namespace zero::memory

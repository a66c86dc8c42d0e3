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

// In a KeepFreedSharedPages scope: a kept range of `bytes` (page-rounded),
// zero-filled, if one was freed; else nullopt (then map_shared_range). Its
// pages were counted while kept (set_kept_bytes_observer), so the caller
// counts nothing more.
std::optional<SharedRange> take_kept_range(size_t bytes);

// Unmaps `r` and, in its owner, frees its pages and lets the range be
// reused. `resident`: its pages are in memory (not punched out by a release),
// so that a KeepFreedSharedPages scope may keep them.
void free_shared_range(const SharedRange& r, bool resident = true);

// While one of these is alive, a freed range keeps its pages and its mapping,
// and take_kept_range hands it to the next request of its size, zero-filled
// by a memset -- against a fresh range, whose every 4 KiB page costs a fault,
// a page allocation and its clearing, and a fallocate to punch it out again.
// For a phase that frees and maps buffers of the same sizes in turn: the
// backward at stage 3 (and stage 2 with overlap_comm), where each unit's full
// grad buffer lives from its first grad to its reduce-scatter (at 2 ranks on
// the ~101M GPT those faults were 8% of stage 3's step; docs/performance.md).
// The bound: the arena's ranges in use plus those kept never exceed the most
// of them in use at once since the outermost scope began, plus a 32 MiB
// slack -- a fresh range that would pass it first punches kept ranges out,
// the least recently freed first -- so the shared buffers hold no more than
// they did at their peak in the phase (other memory, such as activations, is
// not in that count; the CPU allocator's cache counts kept pages as in use:
// set_kept_bytes_observer). When the last scope ends, of each size it
// asked for the most recently freed kept range is carried to the next
// scope (in all within the largest of them and the slack), whose first
// request of that size takes it: at stage 3 the first grad buffer of the
// next backward, which otherwise faults in fresh pages every step. That
// buffer is in use beside all of the forward's activations, so its pages
// held through the forward do not raise the step's peak. The rest go back
// to the OS. Carried ranges count as in use at the next scope's start; a
// range mapped outside any scope, or release_kept_shared_pages, gives them
// back first. Scopes nest; any thread. ZERO_KEEP_FREED_PAGES (for measuring what keeping
// saves): on (the default); within-scope, nothing carried past a scope; off,
// scopes keep nothing. Another value throws std::invalid_argument.
class KeepFreedSharedPages {
 public:
  KeepFreedSharedPages();
  ~KeepFreedSharedPages();
  KeepFreedSharedPages(const KeepFreedSharedPages&) = delete;
  KeepFreedSharedPages& operator=(const KeepFreedSharedPages&) = delete;
};

// Gives back the ranges carried from the last scope (none while one is
// alive): for an owner of scopes that ends, so nothing waits for a next one.
void release_kept_shared_pages();

// Whether freed pages may be kept for the next buffer of their size, here
// and in stage 3's hand-over of a released unit's pages
// (memory/page_buffer.h hold_pages): ZERO_KEEP_FREED_PAGES=off says no, for
// measuring what keeping saves.
bool keeping_freed_pages();

// Counts, for tests and the step summary.
struct SharedArenaStats {
  uint64_t kept_reuses = 0;  // requests served by a kept range (take_kept_range)
  size_t kept_bytes = 0;     // held now by kept ranges (carried ones included)
  size_t fresh_bytes = 0;    // mapped afresh in the current or last outermost scope
  uint64_t memfd_inode = 0;  // this process's memfd (0 before its first buffer): its ranges told from a peer's
};
SharedArenaStats shared_arena_stats();

// Told each change in the bytes kept (+ when a range is kept, - when one is
// punched out; one taken back stays counted, now in use): the caching CPU
// allocator counts them as memory in use outside it (memory/cpu_allocator.h). One observer; null:
// none. Returns the one it replaces.
using KeptBytesObserver = void (*)(std::ptrdiff_t bytes);
KeptBytesObserver set_kept_bytes_observer(KeptBytesObserver observer);

// Frees `r`'s pages, keeping the mapping (they read as zeros); false with
// errno on failure.
bool punch_shared_range(const SharedRange& r);

}  // namespace zero::memory

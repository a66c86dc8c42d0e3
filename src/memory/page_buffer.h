// Large flat buffers whose pages go straight back to the OS when freed.
//
// glibc's malloc raises its mmap threshold after a large free, so later
// buffers of that size come from the heap and, once freed, stay resident:
// stage 3's release/regather cycles and the transient grad buffers would
// then never lower the process's memory. These buffers are mmap'd and
// munmap'd instead (fresh pages arrive zero-filled, so zeroing is free), and
// resizing their storage -- how stage 3 releases and regathers -- goes
// through the same allocator.
//
// zeros_flat's buffers are ranges of the process's memfd mapped shared
// (memory/shared_arena.h; ZERO_SHARED_BUFFERS=off: private), so that ranks
// on this host can read each other's flat params and grads in place
// (comm/shm/peer_buffers.h): their pages count in RSS as shared memory,
// once per host in PSS. A process forked from a rank shares them too (its
// writes are the rank's). On release and on free their pages are punched
// out of the memfd, so a peer's cached mapping keeps no memory alive.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include "memory/release_guard.h"

namespace zero::memory {

// A 1-D tensor of `numel` zeros of `dtype` on page-backed storage (on a
// CUDA device, or on the host with ZERO_PAGE_BUFFERS=off: an ordinary tensor).
// `shared`: on a memfd peers can map (below); false: private pages, for a
// buffer no peer reads (stage 3's full param buffers, gather outputs only,
// whose pages are faulted in afresh at every regather -- cheaper so).
at::Tensor zeros_flat(int64_t numel, at::ScalarType dtype, at::Device device = at::kCPU, bool shared = true);

// A zeros_flat copy of `src` (1-D), in `dtype` if given: for buffers the
// collectives read, such as stage 3's param shards.
at::Tensor flat_copy_of(const at::Tensor& src, std::optional<at::ScalarType> dtype = std::nullopt);

// Stage 3's release and regather of a page-backed buffer: release returns
// its pages to the OS and makes the range inaccessible; restore makes it
// accessible again, zero-filled. Its address and storage never change, so
// params and the tensors autograd saved -- views of it -- see the
// regathered data, and an access while released faults (see
// name_released_contents) instead of reading freed or stale memory.
bool page_backed(const at::Tensor& t);  // made by zeros_flat on mapped pages
bool shared_backed(const at::Tensor& t);  // ... on a shared memfd

// Where a peer process finds `t`'s bytes: the memfd behind its buffer (as
// /proc/<pid>/fd/<fd>, told apart from another file on the same descriptor
// by its inode), the buffer's range in it, and `t`'s offset in the buffer.
// Null unless `t` is contiguous in a shared zeros_flat buffer whose pages
// are not released.
struct SharedPages {
  int fd;
  uint64_t inode;
  int64_t map_offset;  // of the buffer, in the memfd (page-aligned)
  int64_t map_bytes;   // the whole buffer
  int64_t offset;      // of t's first byte, in the buffer
};
std::optional<SharedPages> shared_pages(const at::Tensor& t);
void release_pages(const at::Tensor& flat);
void restore_pages(const at::Tensor& flat);
bool pages_released(const at::Tensor& flat);  // also while held (below)
// Bytes of `t`'s storage resident in memory: 0 while its pages are released.
int64_t resident_bytes(const at::Tensor& t);

// Stage 3's hand-over of a released unit's pages to the next unit gathered,
// whose gather writes all of it: there is no clearing a fresh page for it
// then (at 2 ranks on the ~101M GPT, refilling the gathered units' buffers
// was 2% of stage 3's step; docs/performance.md). hold_pages makes a private
// resident buffer inaccessible, as release_pages does, but keeps its pages:
// false, and nothing done, for a shared or non-page buffer or where
// page_handoffs_possible() is not. take_held_pages makes `to` -- released, with
// pages of the same size -- resident with the pages held by `from` (remapped:
// `to` then holds `from`'s old bytes; nothing is copied or zeroed), and
// `from` released; `to` may be `from` (it is accessible again, its bytes
// unchanged). False, and nothing done, where it cannot. release_pages lets a
// held buffer's pages go; restore_pages on one clears it.
bool hold_pages(const at::Tensor& flat);
bool take_held_pages(const at::Tensor& to, const at::Tensor& from);
uint64_t page_handoffs();  // how many take_held_pages moved pages between buffers
// Unless ZERO_KEEP_FREED_PAGES=off, or the kernel cannot move pages
// (MREMAP_DONTUNMAP, Linux 5.7+).
bool page_handoffs_possible();
// Names what `flat` holds, for the message a process stops with when it
// reads or writes the buffer while released (memory/release_guard.h).
void name_released_contents(const at::Tensor& flat, std::vector<NamedRange> ranges, std::string advice);

// While alive, CPU tensors of at least 64 KiB are page-backed too (smaller
// ones keep libtorch's allocator). zero::Init uses it so the params of each
// unit, built by the user's constructors and freed once sharded, return
// their memory instead of fragmenting the heap. Scopes nest; not for use
// from several threads at once.
class PageBackedScope {
 public:
  PageBackedScope();
  ~PageBackedScope();
  PageBackedScope(const PageBackedScope&) = delete;
  PageBackedScope& operator=(const PageBackedScope&) = delete;

 private:
  c10::Allocator* previous_;
};

}  // namespace zero::memory

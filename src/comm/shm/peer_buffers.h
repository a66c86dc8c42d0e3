// The peers' flat buffers, mapped read-only into this process so that a
// collective reads them in place (the zero-copy path of comm/shm/lane.h).
//
// A rank names a buffer by its pid, the descriptor number and inode of its
// process's memfd, and the buffer's range in it (memory/shared_arena.h); a
// peer opens /proc/<pid>/fd/<fd> -- the same file, if the inode matches --
// maps that range and closes the descriptor at once: a mapping needs none,
// so however many buffers are cached, no descriptor is held. Mappings are
// cached per peer and range (the engine's buffers live for the whole run,
// and an owner reuses a freed range for the next buffer of its size, which
// the cached mapping then serves); at most kMaxCached, the least recently
// used dropped first. A freed buffer's pages are punched out of the memfd,
// so a stale mapping holds no memory.
//
// After each zero-copy collective the lane drops the page-table entries of
// what it read (release_read_pages): the pages stay the owner's, and the
// next read faults them back in (64 KiB at a time, no clearing: they are in
// the memfd). Kept, they would count in this process's RSS as well as in
// their owner's -- a peer's whole param shard at stage 3 and its grad
// buffers at stage 0, 241 and 385 MiB a rank on the ~101M GPT at 2 ranks --
// which is memory this process does not hold (docs/performance.md, "Where
// a rank's bytes are"). ZERO_COMM_PEER_PAGES=keep keeps them mapped (for
// measuring). Not thread-safe: one per lane. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::comm::shm {

// Where a buffer's bytes are, as its owner publishes them for one
// collective. inode 0: the owner's data is not in a shareable buffer.
struct BufferRef {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t inode = 0;
  int64_t map_offset = 0;  // of the buffer in the memfd (page-aligned)
  int64_t map_bytes = 0;   // the whole buffer
  int64_t offset = 0;      // of the collective's data in it
  bool shareable() const { return inode != 0; }
};
static_assert(sizeof(BufferRef) == 40, "a header cell");

class PeerBuffers {
 public:
  static constexpr size_t kMaxCached = 64;

  PeerBuffers();  // throws std::invalid_argument on a bad ZERO_COMM_PEER_PAGES
  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  // The first byte of the collective's data in `ref`'s buffer, mapped here.
  // Throws std::runtime_error naming the peer if it cannot be mapped.
  const char* data(int peer, const BufferRef& ref);

  // Whether this process can map a buffer another process publishes: tried
  // once per group at setup, on a small probe buffer.
  static bool can_map(const BufferRef& ref, std::string* why);

  // Drops this process's page-table entries of every buffer read since the
  // last call (madvise MADV_DONTNEED on a shared mapping: the owner's pages
  // and their contents stay). Call once the reads are done.
  void release_read_pages();

  size_t cached() const { return entries_.size(); }

 private:
  struct Entry {
    int peer;
    uint64_t inode;
    int64_t map_offset;
    int64_t bytes;
    const char* base;
    bool read;  // since the last release_read_pages
  };
  void drop(size_t i);
  std::vector<Entry> entries_;  // most recently used last
  bool release_read_;           // ZERO_COMM_PEER_PAGES
};

}  // namespace zero::comm::shm

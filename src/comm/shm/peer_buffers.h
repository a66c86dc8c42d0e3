// The peers' flat buffers, mapped read-only into this process so that a
// collective reads them in place (the zero-copy path of comm/shm/lane.h).
//
// A rank names a buffer by its pid, the memfd's descriptor number and
// inode (memory/page_buffer.h); a peer opens /proc/<pid>/fd/<fd> -- the
// same file, if the inode matches -- and maps it. Mappings are cached per
// peer and buffer: the engine's buffers live for the whole run, and a
// grad buffer made each step costs one mmap then. An owner truncates its
// memfd when it frees the buffer, so a stale cached mapping holds no
// memory; stale entries are dropped when found (size 0) and at most
// kMaxCached are kept. Not thread-safe: one per lane. No torch.
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
  int64_t map_bytes = 0;  // the whole memfd
  int64_t offset = 0;     // of the collective's data in it
  bool shareable() const { return inode != 0; }
};
static_assert(sizeof(BufferRef) == 32, "a header cell");

class PeerBuffers {
 public:
  static constexpr size_t kMaxCached = 64;

  PeerBuffers() = default;
  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  // The first byte of the collective's data in `ref`'s buffer, mapped here.
  // Throws std::runtime_error naming the peer if it cannot be mapped.
  const char* data(int peer, const BufferRef& ref);

  // Whether this process can map a buffer another process publishes: tried
  // once per group at setup, on a small probe buffer.
  static bool can_map(const BufferRef& ref, std::string* why);

  size_t cached() const { return entries_.size(); }

 private:
  struct Entry {
    int peer;
    uint64_t inode;
    int64_t bytes;
    int fd;  // kept to notice the owner truncating it
    const char* base;
  };
  static bool alive(const Entry& e);
  void drop(size_t i);
  void drop_stale();
  std::vector<Entry> entries_;  // most recently used last
};

}  // namespace zero::comm::shm

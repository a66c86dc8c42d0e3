// Device buffers that peers on the same GPU read in place: the CUDA IPC
// transport's direct path (comm/cuda_ipc_transport.h), the device twin of
// comm/shm/peer_buffers.h.
//
// An owner names the buffer under a collective's input by torch's caching
// allocator's own shareable handle (shareIpcHandle: the cudaIpcMemHandle of
// the segment the block lies in, or an expandable segment's) and the
// input's offset in what that handle opens; a reader opens it through the
// allocator too (getIpcDevPtr), which shares one mapping per handle within
// the process. A reader caches the mappings it opened, per peer and handle,
// at most kMaxCached, the least recently used closed first: the engine's
// inputs are its flat buffers, the same few segments every step, and an
// open costs a driver call that a collective should not pay each time.
//
// A segment is handed back to the driver only when the owner's allocator
// frees it (empty_cache, or a retry after an allocation failed); a reader
// may then hold a mapping of memory its owner no longer has. Each
// reference carries how many segments its owner has freed so far (counted
// by an allocator trace tracker, attached at the first export): when that
// changes, a reader closes every mapping it holds of that owner before
// opening any, so a stale mapping outlives its segment only until the
// next collective with that peer, and a handle the driver issues again is
// never served from the old mapping. Readers only read inside a collective,
// which ends before any rank frees its input, so no read meets a freed
// segment.
//
// Not thread-safe: one PeerDeviceBuffers per lane (its collectives run one
// at a time). Built with ZERO_CUDA only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace zero::comm::cuda {

// Where a device buffer's bytes are, as its owner publishes them for one
// collective (a round's slot carries it, so a fixed size and no pointers).
struct DeviceBufferRef {
  uint8_t shareable = 0;     // 0: a peer cannot open it; the collective is staged
  uint8_t handle_bytes = 0;  // 0 with shareable: nothing to read (a broadcast's non-root)
  uint32_t owner_frees = 0;  // segments the owner has freed so far
  int64_t offset = 0;        // of the data in what the handle opens
  char handle[240] = {};
};
static_assert(sizeof(DeviceBufferRef) == 256, "one exchange cell");

// `t`'s data, published for peers; not shareable when `t` is empty, not on
// a CUDA device, or not a caching-allocator block this version can share.
DeviceBufferRef export_device_buffer(const at::Tensor& t);

// A reference whose owner publishes nothing to read, but takes part.
inline DeviceBufferRef nothing_to_read() {
  DeviceBufferRef r;
  r.shareable = 1;
  return r;
}

class PeerDeviceBuffers {
 public:
  static constexpr size_t kMaxCached = 64;

  // The first byte of `ref`'s data, mapped here (on the current device).
  // Throws std::runtime_error naming `peer` when it cannot be opened.
  const char* data(int peer, const DeviceBufferRef& ref);

  size_t cached() const { return entries_.size(); }

 private:
  struct Entry {
    int peer;
    std::string handle;
    std::shared_ptr<void> base;  // the allocator's mapping, closed with the last holder
  };
  std::vector<Entry> entries_;           // most recently used last
  std::vector<int64_t> frees_seen_;      // by peer; -1: none seen yet
};

}  // namespace zero::comm::cuda

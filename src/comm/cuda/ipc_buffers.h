// Device buffers that peers on the same GPU read in place: the CUDA IPC
// transport's direct path (comm/cuda_ipc_transport.h), the device twin of
// comm/shm/peer_buffers.h.
//
// An owner names the buffer under a collective's input by torch's caching
// allocator's own shareable handle (shareIpcHandle: the cudaIpcMemHandle of
// the segment the block lies in) and the input's offset in that segment; a
// reader opens it through the allocator too (getIpcDevPtr, which shares one
// mapping per handle within the process). Only cudaMalloc'd segments are
// shared: an expandable segment's handle needs pidfd_getfd in the reader,
// which ptrace restrictions may refuse after the ranks agreed to go direct.
//
// By default a reader closes what it opened once the collective's reads are
// done (close_all, before the collective's last round): while a mapping is
// open its owner still holds the input's block, so its segment cannot be
// freed under it (CUDA leaves a cudaFree of a region still open elsewhere
// undefined). With caching (ZERO_CUDA_IPC_DIRECT_CACHE=on on every rank)
// the mappings stay, per peer and handle, at most kMaxCached, the least
// recently used closed first -- the engine's inputs are the same few
// segments every step, and an open is a driver call -- and each reference
// carries how many segments its owner's allocator has freed so far (an
// allocator trace tracker counts them): when that changes, a reader closes
// every mapping it holds of that owner before opening any. A cached mapping
// may then outlive its segment until the next collective with that peer
// (empty_cache, or an allocation retried after the device was full): the
// undefined case above, which is why caching is not the default until a GPU
// has shown what an open costs.
//
// Not thread-safe: one PeerDeviceBuffers per lane (its collectives run one
// at a time). Built with ZERO_CUDA only.
#pragma once

#include <cstdint>
#include <functional>
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
// a CUDA device, or not a cudaMalloc'd caching-allocator block. With
// `count_frees` (the group caches mappings) the reference carries the
// owner's segment frees.
DeviceBufferRef export_device_buffer(const at::Tensor& t, bool count_frees);

// A reference whose owner publishes nothing to read, but takes part.
inline DeviceBufferRef nothing_to_read() {
  DeviceBufferRef r;
  r.shareable = 1;
  return r;
}

class PeerDeviceBuffers {
 public:
  static constexpr size_t kMaxCached = 64;
  // Opens a handle (what shareIpcHandle wrote) on the current device; the
  // mapping closes with the last holder. Default: the caching allocator's
  // getIpcDevPtr; tests pass their own.
  using Opener = std::function<std::shared_ptr<void>(const std::string& handle)>;
  explicit PeerDeviceBuffers(Opener open = {});

  // The first byte of `ref`'s data, mapped here (on the current device).
  // Throws std::runtime_error naming `peer` when it cannot be opened.
  const char* data(int peer, const DeviceBufferRef& ref);

  // Closes every mapping this reader holds (those other holders in the
  // process share stay open until they let go too).
  void close_all() { entries_.clear(); }

  size_t cached() const { return entries_.size(); }

 private:
  struct Entry {
    int peer;
    std::string handle;
    std::shared_ptr<void> base;  // the allocator's mapping, closed with the last holder
  };
  Opener open_;
  std::vector<Entry> entries_;           // most recently used last
  std::vector<int64_t> frees_seen_;      // by peer; -1: none seen yet
};

}  // namespace zero::comm::cuda

// Device buffers that peers read in place (comm/cuda/ipc_buffers.h).
#include "comm/cuda/ipc_buffers.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

namespace zero::comm::cuda {

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

// Segments this process's caching allocator has handed back to the driver.
std::atomic<uint32_t> segment_frees{0};

// Whether the frees are counted: an allocator backend without trace
// trackers (cudaMallocAsync) shares no handles either.
bool count_segment_frees() {
  static std::once_flag once;
  static bool counted = false;
  std::call_once(once, [] {
    try {
      alloc::attachAllocatorTraceTracker([](const c10::CachingDeviceAllocator::TraceEntry& e) {
        using Action = c10::CachingDeviceAllocator::TraceEntry::Action;
        if (e.action_ == Action::SEGMENT_FREE || e.action_ == Action::SEGMENT_UNMAP)
          segment_frees.fetch_add(1, std::memory_order_relaxed);
      });
      counted = true;
    } catch (const std::exception&) {
    }
  });
  return counted;
}

}  // namespace

DeviceBufferRef export_device_buffer(const at::Tensor& t, bool count_frees) {
  DeviceBufferRef ref;
  if (!t.defined() || !t.is_cuda() || t.numel() == 0) return ref;
  // Counting starts before the first handle: a free after it is seen by the next collective.
  if (count_frees && !count_segment_frees()) return ref;
  // shareIpcHandle looks the block up by its first byte: the storage's.
  void* block = t.storage().data_ptr().get();
  alloc::ShareableHandle h;
  try {
    h = alloc::shareIpcHandle(block);
  } catch (const std::exception&) {
    return ref;  // not the caching allocator's block (from_blob, another allocator backend)
  }
  // [version, type, payload]: a cudaMalloc'd segment's type is 'c' (an
  // expandable segment's, 'e', is not shared: see the header).
  if (h.handle.size() < 2 || h.handle[1] != 'c' || h.handle.size() > sizeof ref.handle) return ref;
  ref.shareable = 1;
  ref.handle_bytes = static_cast<uint8_t>(h.handle.size());
  ref.owner_frees = count_frees ? segment_frees.load(std::memory_order_relaxed) : 0;
  ref.offset = static_cast<int64_t>(h.offset) +
               (static_cast<const char*>(t.const_data_ptr()) - static_cast<const char*>(block));
  std::memcpy(ref.handle, h.handle.data(), h.handle.size());
  return ref;
}

PeerDeviceBuffers::PeerDeviceBuffers(Opener open)
    : open_(open ? std::move(open) : Opener([](const std::string& h) { return alloc::getIpcDevPtr(h); })) {}

const char* PeerDeviceBuffers::data(int peer, const DeviceBufferRef& ref) {
  if (peer >= static_cast<int>(frees_seen_.size())) frees_seen_.resize(static_cast<size_t>(peer) + 1, -1);
  if (frees_seen_[peer] != ref.owner_frees) {
    // The owner freed a segment since: whatever is cached of it may be that one.
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.peer == peer; }),
                   entries_.end());
    frees_seen_[peer] = ref.owner_frees;
  }
  const std::string handle(ref.handle, ref.handle_bytes);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.peer == peer && e.handle == handle; });
  if (it == entries_.end()) {
    std::shared_ptr<void> base;
    try {
      base = open_(handle);
    } catch (const std::exception& e) {
      std::string what = e.what();
      throw std::runtime_error("opening rank " + std::to_string(peer) + "'s device buffer (CUDA IPC): " +
                               what.substr(0, what.find('\n')));
    }
    if (entries_.size() >= kMaxCached) entries_.erase(entries_.begin());
    entries_.push_back({peer, handle, std::move(base)});
  } else {
    std::rotate(it, it + 1, entries_.end());  // most recently used last
  }
  return static_cast<const char*>(entries_.back().base.get()) + ref.offset;
}

}  // namespace zero::comm::cuda

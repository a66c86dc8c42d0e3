// The test device's memory: host memory (so CPU kernels can run on it in
// place) handed out the way CUDA's caching allocator hands out device
// memory -- on the calling thread's *current* device, whatever tensor it is
// for -- with per-device statistics and a capacity beyond which allocation
// fails with an out-of-memory error.
//
// Unlike the caching allocator nothing is cached or rounded: a block is
// exactly the bytes asked for and goes back to the host when freed, so the
// statistics count requested bytes. Fresh blocks are filled with 0xFF bytes
// (NaN for floating types): code that assumes new memory reads as zero, as
// fresh host pages do but reused device blocks do not, shows up.
#pragma once

#include <array>
#include <map>
#include <mutex>
#include <optional>

#include <c10/core/CachingDeviceAllocator.h>

#include "test_device_guard.h"

namespace zero::test_device::detail {

class DeviceMemory final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}                        // nothing is cached
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}  // streams are in order
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total): the capacity less what is allocated.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  void set_capacity(c10::DeviceIndex device, size_t bytes);
  size_t capacity(c10::DeviceIndex device);
  // The device whose block holds `ptr`, if any does.
  std::optional<c10::DeviceIndex> device_of(const void* ptr);

 private:
  struct Device {
    std::mutex mutex;
    c10::CachingDeviceAllocator::DeviceStats stats;
    size_t capacity = size_t{64} << 30;
    std::map<const char*, size_t> blocks;  // start -> bytes
  };
  struct Block;
  static void free_block(void* block);
  Device& device(c10::DeviceIndex index);

  std::array<Device, kMaxDevices> devices_;
};

// Page-locked host memory stands for itself: plain host blocks this
// allocator remembers, so isPinnedPtr can tell them apart from others.
class PinnedHostMemory final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool is_pinned(const void* ptr);

 private:
  static void free_block(void* block);
  std::mutex mutex_;
  std::map<const char*, size_t> blocks_;
};

DeviceMemory& device_memory();
PinnedHostMemory& pinned_host_memory();

}  // namespace zero::test_device::detail

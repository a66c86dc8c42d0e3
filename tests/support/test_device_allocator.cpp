#include "test_device_allocator.h"

#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace zero::test_device::detail {

namespace {

constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

std::string format_bytes(size_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (bytes >= (size_t{1} << 30)) {
    out << static_cast<double>(bytes) / (size_t{1} << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    out << static_cast<double>(bytes) / (size_t{1} << 20) << " MiB";
  } else {
    out << bytes << " bytes";
  }
  return out.str();
}

// The block whose range holds `ptr` in a start -> bytes map.
bool holds(const std::map<const char*, size_t>& blocks, const void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  auto it = blocks.upper_bound(p);
  if (it == blocks.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace

struct DeviceMemory::Block {
  DeviceMemory* owner;
  void* ptr;
  size_t bytes;
  c10::DeviceIndex device;
};

DeviceMemory::Device& DeviceMemory::device(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "zdev: no device ", static_cast<int>(index));
  return devices_[index];
}

c10::DataPtr DeviceMemory::allocate(size_t bytes) {
  // CUDA's caching allocator serves the current device, not the device of the
  // tensor the memory is for: a kernel or resize that forgets its device guard
  // gets memory elsewhere, and the kernels' checks report it when it is used.
  const c10::DeviceIndex index = current_device();
  const c10::Device where(c10::DeviceType::PrivateUse1, index);
  if (bytes == 0) return c10::DataPtr(nullptr, where);
  Device& d = device(index);
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    auto& allocated = d.stats.allocated_bytes[kAggregate];
    if (static_cast<size_t>(allocated.current) + bytes > d.capacity) {
      ++d.stats.num_ooms;
      const size_t free = d.capacity - static_cast<size_t>(allocated.current);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "zdev out of memory. Tried to allocate ", format_bytes(bytes),
                       ". Device ", static_cast<int>(index), " has a total capacity of ", format_bytes(d.capacity),
                       " of which ", format_bytes(free), " is free.");
    }
    for (auto* stat :
         {&d.stats.allocated_bytes, &d.stats.reserved_bytes, &d.stats.active_bytes, &d.stats.requested_bytes}) {
      (*stat)[kAggregate].increase(bytes);
    }
    for (auto* stat : {&d.stats.allocation, &d.stats.segment, &d.stats.active}) (*stat)[kAggregate].increase(1);
    ++d.stats.num_device_alloc;
  }
  void* ptr = c10::alloc_cpu(bytes);
  std::memset(ptr, 0xFF, bytes);
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.blocks.emplace(static_cast<const char*>(ptr), bytes);
  }
  return c10::DataPtr(ptr, new Block{this, ptr, bytes, index}, &DeviceMemory::free_block, where);
}

void DeviceMemory::free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  Device& d = block->owner->devices_[block->device];
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    for (auto* stat :
         {&d.stats.allocated_bytes, &d.stats.reserved_bytes, &d.stats.active_bytes, &d.stats.requested_bytes}) {
      (*stat)[kAggregate].decrease(block->bytes);
    }
    for (auto* stat : {&d.stats.allocation, &d.stats.segment, &d.stats.active}) (*stat)[kAggregate].decrease(1);
    ++d.stats.num_device_free;
    d.blocks.erase(static_cast<const char*>(block->ptr));
  }
  c10::free_cpu(block->ptr);
  delete block;
}

void DeviceMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

c10::CachingDeviceAllocator::DeviceStats DeviceMemory::getDeviceStats(c10::DeviceIndex index) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.stats;
}

void DeviceMemory::resetAccumulatedStats(c10::DeviceIndex index) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  for (auto* stat : {&d.stats.allocation, &d.stats.segment, &d.stats.active, &d.stats.allocated_bytes,
                     &d.stats.reserved_bytes, &d.stats.active_bytes, &d.stats.requested_bytes}) {
    for (auto& s : *stat) s.reset_accumulated();
  }
  d.stats.num_ooms = 0;
  d.stats.num_device_alloc = 0;
  d.stats.num_device_free = 0;
}

void DeviceMemory::resetPeakStats(c10::DeviceIndex index) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  for (auto* stat : {&d.stats.allocation, &d.stats.segment, &d.stats.active, &d.stats.allocated_bytes,
                     &d.stats.reserved_bytes, &d.stats.active_bytes, &d.stats.requested_bytes}) {
    for (auto& s : *stat) s.reset_peak();
  }
}

std::pair<size_t, size_t> DeviceMemory::getMemoryInfo(c10::DeviceIndex index) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  const auto used = static_cast<size_t>(d.stats.allocated_bytes[kAggregate].current);
  return {used < d.capacity ? d.capacity - used : 0, d.capacity};
}

void DeviceMemory::set_capacity(c10::DeviceIndex index, size_t bytes) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  d.capacity = bytes;
}

size_t DeviceMemory::capacity(c10::DeviceIndex index) {
  Device& d = device(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.capacity;
}

std::optional<c10::DeviceIndex> DeviceMemory::device_of(const void* ptr) {
  for (int i = 0; i < device_count(); ++i) {
    Device& d = devices_[i];
    std::lock_guard<std::mutex> lock(d.mutex);
    if (holds(d.blocks, ptr)) return static_cast<c10::DeviceIndex>(i);
  }
  return std::nullopt;
}

c10::DataPtr PinnedHostMemory::allocate(size_t bytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes == 0) return c10::DataPtr(nullptr, cpu);
  void* ptr = c10::alloc_cpu(bytes);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.emplace(static_cast<const char*>(ptr), bytes);
  }
  return c10::DataPtr(ptr, ptr, &PinnedHostMemory::free_block, cpu);
}

void PinnedHostMemory::free_block(void* ptr) {
  PinnedHostMemory& self = pinned_host_memory();
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    self.blocks_.erase(static_cast<const char*>(ptr));
  }
  c10::free_cpu(ptr);
}

void PinnedHostMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count) std::memcpy(dest, src, count);
}

bool PinnedHostMemory::is_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  return holds(blocks_, ptr);
}

// Leaked on purpose: blocks may be freed by static destructors after ours ran.
DeviceMemory& device_memory() {
  static auto* memory = new DeviceMemory();
  return *memory;
}

PinnedHostMemory& pinned_host_memory() {
  static auto* memory = new PinnedHostMemory();
  return *memory;
}

}  // namespace zero::test_device::detail

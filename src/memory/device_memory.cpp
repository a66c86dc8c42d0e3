#include "memory/device_memory.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

namespace zero::memory {

namespace {

c10::DeviceAllocator* allocator_of(c10::Device device) {
  if (device.is_cpu()) return nullptr;
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(device.type()));
}

c10::DeviceIndex index_of(c10::Device device) { return device.has_index() ? device.index() : 0; }

constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// The allocator's statistics for `device`; nullopt where it keeps none.
std::optional<c10::CachingDeviceAllocator::DeviceStats> stats_of(c10::Device device) {
  auto* a = allocator_of(device);
  if (!a) return std::nullopt;
  try {
    return a->getDeviceStats(index_of(device));
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<int64_t> device_free_bytes(c10::Device device) {
  auto* a = allocator_of(device);
  const auto stats = stats_of(device);
  if (!a || !stats) return std::nullopt;
  try {
    const size_t free = a->getMemoryInfo(index_of(device)).first;
    const int64_t cached_unused = stats->reserved_bytes[kAll].current - stats->allocated_bytes[kAll].current;
    return static_cast<int64_t>(free) + (cached_unused > 0 ? cached_unused : 0);
  } catch (const c10::Error&) {
    return std::nullopt;  // an allocator that does not say
  }
}

std::optional<int64_t> device_allocated_bytes(c10::Device device) {
  const auto stats = stats_of(device);
  return stats ? std::optional<int64_t>(stats->allocated_bytes[kAll].current) : std::nullopt;
}

std::optional<int64_t> device_peak_allocated_bytes(c10::Device device) {
  const auto stats = stats_of(device);
  return stats ? std::optional<int64_t>(stats->allocated_bytes[kAll].peak) : std::nullopt;
}

void reset_device_peak(c10::Device device) {
  if (auto* a = allocator_of(device)) {
    try {
      a->resetPeakStats(index_of(device));
    } catch (const c10::Error&) {
    }
  }
}

}  // namespace zero::memory

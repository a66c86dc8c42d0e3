// install(): the backend's name, device guard, allocator, hooks and kernels,
// all registered at run time so that nothing changes in a process that does
// not ask for zdev (the same test binaries run on GPU machines).
#include "test_device.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>

#include "test_device_allocator.h"
#include "test_device_guard.h"
#include "test_device_ops.h"

namespace zero::test_device {

namespace {

std::atomic<bool> g_installed{false};

struct Counters {
  std::atomic<int64_t> device_to_host{0}, host_waits{0}, host_to_device{0}, host_to_device_pageable{0},
      device_to_device{0};
};
Counters g_counters;

// Random ops on zdev run the CPU kernels with the generator they are given,
// the CPU's default when none: a zdev run draws what a CPU run draws. These
// per-device generators exist for the callers that seed every accelerator
// device (at::manual_seed) or ask for one.
std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> generators;
  return generators;
}

// The accelerator hooks: what at::accelerator::*, at::globalContext() and
// pinned-memory allocation ask of the backend.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  void init() const override {}

  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(detail::device_count()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { detail::set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return detail::current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex old = detail::current_device();
    if (device >= 0) detail::set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  bool isPinnedPtr(const void* data) const override { return detail::pinned_host_memory().is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &detail::pinned_host_memory(); }
  at::Device getDeviceFromPtr(void* data) const override {
    const auto index = detail::device_memory().device_of(data);
    TORCH_CHECK(index.has_value(), "zdev: ", data, " is not in device memory");
    return at::Device(c10::DeviceType::PrivateUse1, *index);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generators().at(detail::resolve(device_index));
  }
  at::Generator getNewGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::createCPUGenerator();
  }

  // Storage::resize_ (UntypedStorage.resize_ in Python): the new block is
  // taken on the storage's device.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    c10::StorageImpl* s = storage.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), "Trying to resize storage that is not resizable");
    const c10::DeviceGuard guard(storage.device());
    c10::DataPtr block = detail::device_memory().allocate(bytes);
    const size_t kept = std::min(bytes, s->nbytes());
    if (kept != 0) std::memcpy(block.get(), s->data(), kept);
    s->set_data_ptr_noswap(std::move(block));
    s->set_nbytes(bytes);
  }
};

}  // namespace

void install(int devices) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (g_installed) {
    TORCH_CHECK(devices == detail::device_count(), "zdev: installed with ", detail::device_count(),
                " devices, asked again for ", devices);
    return;
  }
  TORCH_CHECK(devices >= 1 && devices <= detail::kMaxDevices, "zdev: between 1 and ", detail::kMaxDevices,
              " devices, not ", devices);
  detail::set_device_count(devices);
  c10::register_privateuse1_backend(kName);
  static c10::impl::DeviceGuardImplRegistrar guard_registration(c10::DeviceType::PrivateUse1, detail::guard_impl());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &detail::device_memory(), /*priority=*/UINT8_MAX);
  for (int i = 0; i < devices; ++i) default_generators().push_back(at::detail::createCPUGenerator());
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  detail::register_kernels();
  g_installed = true;
}

bool installed() { return g_installed; }

int device_count() { return detail::device_count(); }

c10::Device device(int index) {
  TORCH_CHECK(installed(), "zdev: install() first");
  return c10::Device(c10::DeviceType::PrivateUse1, detail::resolve(static_cast<c10::DeviceIndex>(index)));
}

void set_capacity(int index, size_t bytes) {
  detail::device_memory().set_capacity(static_cast<c10::DeviceIndex>(index), bytes);
}

size_t capacity(int index) { return detail::device_memory().capacity(static_cast<c10::DeviceIndex>(index)); }

TransferCounts transfer_counts() {
  TransferCounts c;
  c.device_to_host = g_counters.device_to_host;
  c.host_waits = g_counters.host_waits;
  c.host_to_device = g_counters.host_to_device;
  c.host_to_device_pageable = g_counters.host_to_device_pageable;
  c.device_to_device = g_counters.device_to_device;
  return c;
}

void reset_transfer_counts() {
  g_counters.device_to_host = 0;
  g_counters.host_waits = 0;
  g_counters.host_to_device = 0;
  g_counters.host_to_device_pageable = 0;
  g_counters.device_to_device = 0;
}

namespace detail {

void count_transfer(Transfer kind, bool host_waits, bool from_pageable) {
  if (from_pageable) ++g_counters.host_to_device_pageable;
  switch (kind) {
    case Transfer::DeviceToHost:
      ++g_counters.device_to_host;
      break;
    case Transfer::HostToDevice:
      ++g_counters.host_to_device;
      break;
    case Transfer::DeviceToDevice:
      ++g_counters.device_to_device;
      break;
  }
  if (host_waits) ++g_counters.host_waits;
}

}  // namespace detail

}  // namespace zero::test_device

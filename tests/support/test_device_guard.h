// The test device's runtime state as c10 sees it through its
// DeviceGuardImplInterface: how many devices there are, which one is the
// calling thread's current device, its streams and events.
//
// Kernels run synchronously on the calling thread, so every stream is always
// idle and every event has always completed; streams and events exist so
// that code which records, waits on and synchronizes them (the autograd
// engine, c10d, our own GPU path) runs unchanged.
#pragma once

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace zero::test_device::detail {

// A fixed upper bound keeps the per-thread state a plain array.
constexpr int kMaxDevices = 16;

void set_device_count(int devices);
int device_count();

// The calling thread's current device (0 until it sets one), as
// cudaGetDevice/cudaSetDevice keep it.
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// An index of -1 means "the current device", as in c10::Device.
c10::DeviceIndex resolve(c10::DeviceIndex index);

const c10::impl::DeviceGuardImplInterface* guard_impl();

}  // namespace zero::test_device::detail

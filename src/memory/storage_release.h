// Stage 3's release and regather of a flat buffer that is not page-backed
// host memory -- device memory above all -- as FSDP2 frees its unsharded
// params: the storage keeps its identity (the params, and the tensors
// autograd saved, are views of it and see whatever it holds when read) but
// hands its block back to its allocator (the CUDA caching allocator; size
// 0, no data), and takes a fresh block before a gather fills it: left
// unwritten, since the gather overwrites every element (padding included).
//
// Unlike the page-backed host path (memory/page_buffer.h) the address
// changes across a release, and a kernel that reads a released buffer reads
// a null pointer rather than stopping with the param's name. Stream safety
// is the caching allocator's: a freed block is reused by its own stream in
// order, and by another only after the collectives that used it (c10d
// records them) have finished.
//
// The fresh block is taken on the buffer's own device, whatever the
// thread's current device is (the caching allocator allocates on the
// current one: a rank whose current device was never set would get device
// 0's memory under a cuda:1 tensor).
//
// Works for any device's storage (the tests use host tensors and the CPU-backed
// test device, tests/support/test_device.h).
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/ATen.h>

namespace zero::memory {

void release_storage(const at::Tensor& flat);
// Restores `flat`'s whole extent (it must start its storage), its contents
// undefined: the caller overwrites all of it.
void restore_storage(const at::Tensor& flat);
bool storage_released(const at::Tensor& flat);
// A flat buffer of `numel` elements on `device` that never holds memory
// until restored, as if just released: for a buffer a gather fills later
// (zero::Init's units that had no room on the device never take the whole
// unit there). `cut_views` runs while the storage still declares the whole
// extent (views are bounds-checked against it), before the release.
at::Tensor released_flat(int64_t numel, at::ScalarType dtype, c10::Device device,
                         const std::function<void(const at::Tensor&)>& cut_views);

}  // namespace zero::memory

// Stage 3's release and regather of a flat buffer that is not page-backed
// host memory -- device memory above all -- as FSDP2 frees its unsharded
// params: the storage keeps its identity (the params, and the tensors
// autograd saved, are views of it and see whatever it holds when read) but
// hands its block back to its allocator (the CUDA caching allocator; size
// 0, no data), and takes a fresh zero-filled block before a gather fills it.
//
// Unlike the page-backed host path (memory/page_buffer.h) the address
// changes across a release, and a kernel that reads a released buffer reads
// a null pointer rather than stopping with the param's name. Stream safety
// is the caching allocator's: a freed block is reused by its own stream in
// order, and by another only after the collectives that used it (c10d
// records them) have finished.
//
// Works for any device's storage (the tests use host tensors).
#pragma once

#include <ATen/ATen.h>

namespace zero::memory {

void release_storage(const at::Tensor& flat);
// Restores `flat`'s whole extent (it must start its storage), zero-filled.
void restore_storage(const at::Tensor& flat);
bool storage_released(const at::Tensor& flat);

}  // namespace zero::memory

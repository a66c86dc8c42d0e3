// Large flat buffers whose pages go straight back to the OS when freed.
//
// glibc's malloc raises its mmap threshold after a large free, so later
// buffers of that size come from the heap and, once freed, stay resident:
// stage 3's release/regather cycles and the transient grad buffers would
// then never lower the process's memory. These buffers are mmap'd and
// munmap'd instead (fresh pages arrive zero-filled, so zeroing is free), and
// resizing their storage -- how stage 3 releases and regathers -- goes
// through the same allocator.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

namespace zero::memory {

// A 1-D tensor of `numel` zeros of `dtype` on page-backed storage.
at::Tensor zeros_flat(int64_t numel, at::ScalarType dtype);

// While alive, CPU tensors of at least 64 KiB are page-backed too (smaller
// ones keep libtorch's allocator). zero::Init uses it so the params of each
// unit, built by the user's constructors and freed once sharded, return
// their memory instead of fragmenting the heap. Scopes nest; not for use
// from several threads at once.
class PageBackedScope {
 public:
  PageBackedScope();
  ~PageBackedScope();
  PageBackedScope(const PageBackedScope&) = delete;
  PageBackedScope& operator=(const PageBackedScope&) = delete;

 private:
  c10::Allocator* previous_;
};

}  // namespace zero::memory

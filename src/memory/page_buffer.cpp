#include "memory/page_buffer.h"

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <string>

#include <c10/core/Allocator.h>

#include "compat/torch_compat.h"

namespace zero::memory {

namespace {

struct Mapping {
  void* ptr;
  size_t bytes;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->ptr, m->bytes);
  delete m;
}

class PageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) ZERO_ALLOCATOR_CONST override {
    if (bytes == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::CPU)};
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("zero-cpp: out of memory allocating a " + std::to_string(bytes >> 20) +
                               " MiB flat buffer: " + std::strerror(errno));
    return {p, new Mapping{p, bytes}, &unmap, c10::Device(c10::DeviceType::CPU)};
  }
#if ZERO_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif
};

PageAllocator g_allocator;

// Big blocks from pages, small ones from the allocator it replaced.
class HybridAllocator final : public c10::Allocator {
 public:
  explicit HybridAllocator(c10::Allocator* small) : small_(small) {}
  c10::DataPtr allocate(size_t bytes) ZERO_ALLOCATOR_CONST override {
    return bytes >= kPageBackedMin ? g_allocator.allocate(bytes) : small_->allocate(bytes);
  }
#if ZERO_ALLOCATOR_NEEDS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#endif

 private:
  static constexpr size_t kPageBackedMin = 64 << 10;
  c10::Allocator* small_;
};

}  // namespace

PageBackedScope::PageBackedScope() : previous_(c10::GetAllocator(c10::DeviceType::CPU)) {
  static HybridAllocator hybrid(previous_);
  if (previous_ != &hybrid) c10::SetAllocator(c10::DeviceType::CPU, &hybrid);
}

PageBackedScope::~PageBackedScope() { c10::SetAllocator(c10::DeviceType::CPU, previous_); }

at::Tensor zeros_flat(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, &g_allocator, /*resizable=*/true);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, {numel}, {1});
}

}  // namespace zero::memory

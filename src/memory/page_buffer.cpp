#include "memory/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <cstdlib>
#include <string>

#include <c10/core/Allocator.h>

#include "memory/release_guard.h"

namespace zero::memory {

namespace {

struct Mapping {
  void* ptr;
  size_t bytes;
  bool committed = true;
  int guard_id = -1;  // its registration in memory/release_guard.h
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  unregister_released_region(m->guard_id);
  munmap(m->ptr, m->bytes);
  delete m;
}

size_t page_rounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// The mapping behind a page-backed tensor, or null for other storage.
Mapping* mapping_of(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const c10::DataPtr& dp = t.storage().data_ptr();
  return dp.get_deleter() == &unmap ? static_cast<Mapping*>(dp.get_context()) : nullptr;
}

Mapping& page_mapping(const at::Tensor& t, const char* what) {
  Mapping* m = mapping_of(t);
  if (!m) throw std::logic_error(std::string("zero-cpp: ") + what + " needs a page-backed buffer (memory::zeros_flat)");
  return *m;
}

class PageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::CPU)};
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("zero-cpp: out of memory allocating a " + std::to_string(bytes >> 20) +
                               " MiB flat buffer: " + std::strerror(errno));
    return {p, new Mapping{p, bytes}, &unmap, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

PageAllocator g_allocator;

// Big blocks from pages, small ones from the allocator it replaced.
class HybridAllocator final : public c10::Allocator {
 public:
  explicit HybridAllocator(c10::Allocator* small) : small_(small) {}
  c10::DataPtr allocate(size_t bytes) override {
    return bytes >= kPageBackedMin ? g_allocator.allocate(bytes) : small_->allocate(bytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

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

bool page_backed(const at::Tensor& t) { return mapping_of(t) != nullptr; }

void release_pages(const at::Tensor& flat) {
  if (flat.storage().nbytes() == 0) return;
  Mapping& m = page_mapping(flat, "release_pages");
  if (!m.committed) return;
  const size_t len = page_rounded(m.bytes);
  if (madvise(m.ptr, len, MADV_DONTNEED) != 0 || mprotect(m.ptr, len, PROT_NONE) != 0)
    throw std::runtime_error(std::string("zero-cpp: releasing a flat buffer failed: ") + std::strerror(errno));
  m.committed = false;
}

void restore_pages(const at::Tensor& flat) {
  if (flat.storage().nbytes() == 0) return;
  Mapping& m = page_mapping(flat, "restore_pages");
  if (m.committed) return;
  if (mprotect(m.ptr, page_rounded(m.bytes), PROT_READ | PROT_WRITE) != 0)
    throw std::runtime_error(std::string("zero-cpp: restoring a flat buffer failed: ") + std::strerror(errno));
  m.committed = true;
}

bool pages_released(const at::Tensor& flat) {
  const Mapping* m = mapping_of(flat);
  return m && !m->committed;
}

int64_t resident_bytes(const at::Tensor& t) {
  if (!t.defined() || pages_released(t)) return 0;
  return static_cast<int64_t>(t.storage().nbytes());
}

void name_released_contents(const at::Tensor& flat, std::vector<NamedRange> ranges, std::string advice) {
  if (flat.storage().nbytes() == 0 || !page_backed(flat)) return;  // others (device buffers): no page guard
  Mapping& m = page_mapping(flat, "name_released_contents");
  unregister_released_region(m.guard_id);
  m.guard_id = register_released_region(m.ptr, page_rounded(m.bytes), std::move(ranges), std::move(advice));
}

at::Tensor zeros_flat(int64_t numel, at::ScalarType dtype, at::Device device) {
  // Device memory comes from libtorch's caching allocator (cudaMalloc'd
  // blocks it reuses); page release is a host-memory mechanism.
  // ZERO_PAGE_BUFFERS=off gives host buffers libtorch's allocator too, so
  // that stage 3 releases them as it releases device buffers
  // (memory/storage_release.h): how CI runs the GPU's stage-3 path on a CPU.
  static const bool pages = [] {
    const char* v = std::getenv("ZERO_PAGE_BUFFERS");
    return !(v && std::string(v) == "off");
  }();
  if (!device.is_cpu() || !pages) return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(device));
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, &g_allocator, /*resizable=*/true);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, {numel}, {1});
}

}  // namespace zero::memory

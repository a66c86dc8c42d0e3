#include "memory/page_buffer.h"

#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <cstdlib>
#include <optional>
#include <string>

#include <c10/core/Allocator.h>

#include "memory/cpu_allocator.h"
#include "memory/release_guard.h"
#include "memory/shared_arena.h"

namespace zero::memory {

namespace {

struct Mapping {
  void* ptr;
  size_t bytes;
  bool committed = true;
  int guard_id = -1;                   // its registration in memory/release_guard.h
  std::optional<SharedRange> shared = std::nullopt;  // its range of the process's shared memfd, or none (anonymous)
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  unregister_released_region(m->guard_id);
  if (m->committed) note_pages_outside_cache(-static_cast<std::ptrdiff_t>(m->bytes));
  // A shared range's pages are freed now, not when the last peer's cached
  // mapping lets go (memory/shared_arena.h).
  if (m->shared) free_shared_range(*m->shared, /*resident=*/m->committed);
  else munmap(m->ptr, m->bytes);
  delete m;
}

[[noreturn]] void out_of_memory(size_t bytes) {
  throw std::runtime_error("zero-cpp: out of memory allocating a " + std::to_string(bytes >> 20) +
                           " MiB flat buffer: " + std::strerror(errno));
}

// A buffer of `bytes` on `r`, a range of the process's memfd mapped shared:
// peers on this host can map the same pages (comm/shm/peer_buffers.h).
c10::DataPtr wrap(const SharedRange& r, size_t bytes) {
  auto* m = new Mapping{r.ptr, bytes};
  m->shared = r;
  return {m->ptr, m, &unmap, c10::Device(c10::DeviceType::CPU)};
}

// Shared pages fault in more slowly than private ones: only where the
// zero-copy collectives may read them (not with ZERO_COMM_ZERO_COPY=off or
// ZERO_COMM_FASTPATH=off, which stage every collective).
bool shared_buffers_enabled() {
  static const bool on = [] {
    for (const char* name : {"ZERO_SHARED_BUFFERS", "ZERO_COMM_ZERO_COPY", "ZERO_COMM_FASTPATH"}) {
      const char* v = std::getenv(name);
      if (v && std::string(v) == "off") return false;
    }
    return true;
  }();
  return on;
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

constexpr size_t kHugePage = size_t{2} << 20;

// `shared`: the engine's flat buffers, which the shared-memory transport's
// peers read in place; private: the rest (zero::Init's param scope).
class PageAllocator final : public c10::Allocator {
 public:
  explicit PageAllocator(bool shared) : shared_(shared) {
    // Pages a scope keeps after their buffer is freed are memory in use
    // outside the CPU allocator's cache, as the buffer's were.
    if (shared) set_kept_bytes_observer(&note_pages_outside_cache);
  }
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::CPU)};
    const bool shared = shared_ && shared_buffers_enabled();
    // A kept range's pages are counted already (the observer, above).
    if (shared)
      if (std::optional<SharedRange> r = take_kept_range(bytes)) return wrap(*r, bytes);
    note_pages_outside_cache(static_cast<std::ptrdiff_t>(bytes));  // before: the cache makes room
    // No memfd on this system: a private buffer, whose collectives take the staged path.
    if (shared)
      if (std::optional<SharedRange> r = map_shared_range(bytes)) return wrap(*r, bytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      note_pages_outside_cache(-static_cast<std::ptrdiff_t>(bytes));
      out_of_memory(bytes);
    }
    // Stage 3 releases and refills its gathered params every step: in 2 MiB
    // pages that is one fault where 4 KiB pages take 512 (where the system's
    // transparent huge pages are "madvise" or "always"; a hint otherwise).
    if (bytes >= kHugePage) madvise(p, bytes, MADV_HUGEPAGE);
    return {p, new Mapping{p, bytes}, &unmap, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  bool shared_;
};

PageAllocator g_allocator(/*shared=*/false);
PageAllocator g_shared_allocator(/*shared=*/true);

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

bool shared_backed(const at::Tensor& t) {
  const Mapping* m = mapping_of(t);
  return m && m->shared;
}

std::optional<SharedPages> shared_pages(const at::Tensor& t) {
  const Mapping* m = mapping_of(t);
  if (!m || !m->shared || m->shared->owner != getpid() || !m->committed || !t.is_contiguous()) return std::nullopt;
  const char* base = static_cast<const char*>(m->ptr);
  const char* data = static_cast<const char*>(t.data_ptr());
  const size_t end = static_cast<size_t>(data - base) + t.nbytes();
  if (data < base || end > m->bytes) return std::nullopt;
  return SharedPages{m->shared->fd, m->shared->inode, m->shared->offset, static_cast<int64_t>(m->bytes),
                     static_cast<int64_t>(data - base)};
}

void release_pages(const at::Tensor& flat) {
  if (flat.storage().nbytes() == 0) return;
  Mapping& m = page_mapping(flat, "release_pages");
  if (!m.committed) return;
  const size_t len = page_rounded(m.bytes);
  // A shared buffer's pages belong to the memfd: punching them out frees
  // them (and drops them from the peers' mappings); DONTNEED would only
  // unmap them here.
  const bool freed = m.shared ? punch_shared_range(*m.shared) : madvise(m.ptr, len, MADV_DONTNEED) == 0;
  if (!freed || mprotect(m.ptr, len, PROT_NONE) != 0)
    throw std::runtime_error(std::string("zero-cpp: releasing a flat buffer failed: ") + std::strerror(errno));
  m.committed = false;
  note_pages_outside_cache(-static_cast<std::ptrdiff_t>(m.bytes));
}

void restore_pages(const at::Tensor& flat) {
  if (flat.storage().nbytes() == 0) return;
  Mapping& m = page_mapping(flat, "restore_pages");
  if (m.committed) return;
  note_pages_outside_cache(static_cast<std::ptrdiff_t>(m.bytes));  // before its pages come in
  if (mprotect(m.ptr, page_rounded(m.bytes), PROT_READ | PROT_WRITE) != 0) {
    note_pages_outside_cache(-static_cast<std::ptrdiff_t>(m.bytes));
    throw std::runtime_error(std::string("zero-cpp: restoring a flat buffer failed: ") + std::strerror(errno));
  }
  // A gather is about to write all of it: fault every page in with one call
  // rather than one trap per 4 KiB page (Linux 5.14+; older kernels fault
  // them in as the gather writes).
  madvise(m.ptr, page_rounded(m.bytes), MADV_POPULATE_WRITE);
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

at::Tensor zeros_flat(int64_t numel, at::ScalarType dtype, at::Device device, bool shared) {
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
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, shared ? &g_shared_allocator : &g_allocator,
                       /*resizable=*/true);
  return at::empty({0}, at::TensorOptions().dtype(dtype)).set_(storage, 0, {numel}, {1});
}

at::Tensor flat_copy_of(const at::Tensor& src, std::optional<at::ScalarType> dtype) {
  at::Tensor out = zeros_flat(src.numel(), dtype.value_or(src.scalar_type()), src.device());
  out.copy_(src.reshape({-1}));
  return out;
}

}  // namespace zero::memory

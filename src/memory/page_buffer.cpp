#include "memory/page_buffer.h"

#include <stdexcept>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <cstdlib>
#include <optional>
#include <string>

#include <c10/core/Allocator.h>

#include "memory/cpu_allocator.h"
#include "memory/release_guard.h"
#include "memory/shared_arena.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000  // Linux 4.17; glibc before 2.28 lacks the name
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // Linux 5.7; glibc before 2.32 lacks the name
#endif

namespace zero::memory {

namespace {

struct Mapping {
  void* ptr;
  size_t bytes;
  bool committed = true;               // its pages are in memory (counted by note_pages_outside_cache)
  bool held = false;                   // committed but inaccessible: released, pages kept (hold_pages)
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

// Private pages for `bytes`, from a 2 MiB boundary when that large: stage
// 3 moves a released unit's pages into the next unit's buffer (hold_pages),
// which moves whole huge pages only between equally aligned ranges. Null
// when the memory cannot be mapped.
void* map_private(size_t bytes) {
  const size_t slack = bytes >= kHugePage ? kHugePage : 0;
  void* p = mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (slack == 0) return p;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  const size_t end = page_rounded(bytes);
  if (aligned > start) munmap(p, aligned - start);
  munmap(reinterpret_cast<void*>(aligned + end), start + end + slack - (aligned + end));
  return reinterpret_cast<void*>(aligned);
}

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
    void* p = map_private(bytes);
    if (p == nullptr) {
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
  if (!m || !m->shared || m->shared->owner != getpid() || !m->committed || m->held || !t.is_contiguous())
    return std::nullopt;
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
  m.committed = m.held = false;
  note_pages_outside_cache(-static_cast<std::ptrdiff_t>(m.bytes));
}

// The kernel's support (MREMAP_DONTUNMAP) is tried once on a scratch page,
// since a failed move of a buffer's pages could leave its address unmapped.
bool page_handoffs_possible() {
  static const bool ok = keeping_freed_pages() && [] {
    const size_t page = page_rounded(1);
    void* a = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return false;
    char* from = static_cast<char*>(a);
    *from = 1;
    const bool moved = mremap(from, page, page, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, from + page) !=
                       MAP_FAILED && from[page] == 1;
    munmap(a, 2 * page);
    return moved;
  }();
  return ok;
}

namespace {

std::atomic<uint64_t> g_page_handoffs{0};

// After a failed move: the kernel may have unmapped the destination before
// failing. Its address is reserved again (inaccessible, as a released
// buffer's), so that no other mapping can land where its tensors point.
void reserve_again(const Mapping& m) {
  const size_t len = page_rounded(m.bytes);
  void* p = mmap(m.ptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == m.ptr) {
    if (len >= kHugePage) madvise(p, len, MADV_HUGEPAGE);
    return;
  }
  if (p == MAP_FAILED && errno == EEXIST) return;  // still mapped: nothing was unmapped
  if (p != MAP_FAILED) munmap(p, len);
  throw std::runtime_error("zero-cpp: moving a stage 3 unit's pages failed and its buffer's address could not be "
                           "reserved again: " + std::string(std::strerror(errno)));
}

}  // namespace

bool hold_pages(const at::Tensor& flat) {
  Mapping* m = mapping_of(flat);
  if (!m || m->shared || !m->committed || m->held || !page_handoffs_possible()) return false;
  if (mprotect(m->ptr, page_rounded(m->bytes), PROT_NONE) != 0)
    throw std::runtime_error(std::string("zero-cpp: releasing a flat buffer failed: ") + std::strerror(errno));
  m->held = true;
  return true;
}

bool take_held_pages(const at::Tensor& to, const at::Tensor& from) {
  Mapping* dst = mapping_of(to);
  Mapping* src = mapping_of(from);
  // Exactly the same size: the CPU allocator's count of these pages moves
  // with them unchanged.
  if (!dst || !src || !src->held || dst->shared || dst->bytes != src->bytes) return false;
  if (dst != src) {
    if (dst->committed) return false;
    // The page tables move, the pages stay: nothing is copied or cleared.
    // The source keeps its (inaccessible) mapping, now without pages --
    // released -- so its address stays reserved for its own next gather.
    const size_t len = page_rounded(src->bytes);
    if (mremap(src->ptr, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, dst->ptr) == MAP_FAILED) {
      reserve_again(*dst);
      return false;  // the source keeps its pages: the caller lets them go and restores
    }
    src->committed = src->held = false;
    dst->committed = dst->held = true;  // the pages counted as src's count as dst's, inaccessible until below
    ++g_page_handoffs;
  }
  // (Should this fail, dst stays held: a restore would clear it.)
  if (mprotect(dst->ptr, page_rounded(dst->bytes), PROT_READ | PROT_WRITE) != 0)
    throw std::runtime_error(std::string("zero-cpp: restoring a flat buffer failed: ") + std::strerror(errno));
  dst->held = false;
  return true;
}

uint64_t page_handoffs() { return g_page_handoffs.load(); }

void restore_pages(const at::Tensor& flat) {
  if (flat.storage().nbytes() == 0) return;
  Mapping& m = page_mapping(flat, "restore_pages");
  if (m.held) release_pages(flat);  // its old bytes: a restore gives zeros
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
  return m && (!m->committed || m->held);
}

int64_t resident_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const Mapping* m = mapping_of(t);
  if (m && !m->committed) return 0;
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

#include "memory/cpu_allocator.h"

#include <cstdlib>
#include <new>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace zero::memory {

namespace {

// Never destroyed: tensors freed during the process's exit still return
// their blocks here.
LargeBlockCache& large_blocks() {
  // ZERO_LARGE_BLOCK_SLACK_MB sets the slack, for measuring its effect
  // (bench/allocators.sh, "caching-noslack"); ZERO_LARGE_BLOCK_RESIZE=off
  // maps every miss afresh, for measuring what resizing saves.
  static auto* cache = new LargeBlockCache(
      [] {
        const char* mb = std::getenv("ZERO_LARGE_BLOCK_SLACK_MB");
        return mb ? std::strtoull(mb, nullptr, 10) << 20 : kLargeBlockSlackBytes;
      }(),
      [] {
        const char* resize = std::getenv("ZERO_LARGE_BLOCK_RESIZE");
        return !(resize && std::string(resize) == "off");
      }());
  return *cache;
}

// One deleter for both kinds of block (c10's raw interface needs one): a
// block the cache does not know is torch's.
void release(void* block) {
  if (block != nullptr && !large_blocks().free(block)) c10::free_cpu(block);
}

class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* block = bytes >= kLargeBlockBytes ? allocate_large(bytes) : c10::alloc_cpu(bytes);
    return {block, block, &release, c10::Device(c10::DeviceType::CPU)};
  }

 private:
  // Out of memory as torch's own CPU allocator reports it (c10::OutOfMemoryError).
  static void* allocate_large(size_t bytes) {
    try {
      return large_blocks().allocate(bytes);
    } catch (const std::bad_alloc&) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "zero-cpp's caching CPU allocator: not enough memory: you tried to "
                       "allocate ", bytes, " bytes (zero_cpp.cpu_allocator)");
    }
  }

 public:
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }
};

CachingCpuAllocator& caching_allocator() {
  static auto* allocator = new CachingCpuAllocator();
  return *allocator;
}

}  // namespace

bool use_cpu_allocator(CpuAllocator choice) {
  // Torch registers its default at priority 0; an equal priority replaces it.
  c10::SetCPUAllocator(choice == CpuAllocator::Caching ? &caching_allocator() : c10::GetDefaultCPUAllocator(), 0);
  return current_cpu_allocator() == choice;
}

CpuAllocator current_cpu_allocator() {
  return c10::GetCPUAllocator() == &caching_allocator() ? CpuAllocator::Caching : CpuAllocator::Torch;
}

void note_pages_outside_cache(std::ptrdiff_t bytes) {
  if (current_cpu_allocator() == CpuAllocator::Caching) large_blocks().note_outside(bytes);
}

LargeBlockCacheStats cpu_large_block_stats() { return large_blocks().stats(); }

}  // namespace zero::memory

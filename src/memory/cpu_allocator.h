// The allocator torch's CPU tensors come from, chosen by the engine
// (`zero_cpp.cpu_allocator`) for the whole process: c10 has one CPU
// allocator per process.
//
// Caching (the default): tensors of kLargeBlockBytes and more come from a
// LargeBlockCache (memory/large_block_cache.h), smaller ones from torch's
// own allocator. Torch: torch's own allocator for all of them (with glibc's
// mmap threshold, memory/malloc_policy.h, deciding what happens to large
// blocks). Tensors keep the allocator they were made by: switching frees
// nothing and breaks no tensor made before.
//
// What Caching gives up: torch's CPU memory profiler no longer sees these
// allocations (torch's default allocator reports to it; the C++ frontend has
// no profiler UI).
#pragma once

#include <cstddef>

#include <zero/config.h>

#include "memory/large_block_cache.h"

namespace zero::memory {

// Blocks from this size up are cached; the same size as the glibc threshold
// the engine fixes, so glibc's heap keeps only what is smaller.
inline constexpr size_t kLargeBlockBytes = size_t{1} << 20;
// What the cache may hold besides the blocks a step uses (large_block_cache.h).
inline constexpr size_t kLargeBlockSlackBytes = size_t{32} << 20;

// Makes `choice` torch's CPU allocator. Returns false, changing nothing, when
// an allocator of a higher priority than torch's default is registered (the
// user's own choice stands).
bool use_cpu_allocator(CpuAllocator choice);
// The CPU allocator torch uses now: Caching when it is this file's.
CpuAllocator current_cpu_allocator();
// Large transient memory the engine maps itself (memory/page_buffer.h):
// `bytes` more, or fewer, in use outside the cache. The cache gives back
// cached blocks to make room, so the two together stay within their peak.
void note_pages_outside_cache(std::ptrdiff_t bytes);
// The caching allocator's counts (zero when it was never used).
LargeBlockCacheStats cpu_large_block_stats();

}  // namespace zero::memory

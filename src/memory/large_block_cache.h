// Large blocks kept mapped between uses, so a training step's transient
// tensors (activations, autograd's temporaries, scratch) do not fault their
// pages in afresh every step.
//
// Why: with glibc's mmap threshold fixed low (memory/malloc_policy.h) every
// large tensor is an mmap, a page fault per 4 KiB touched and a munmap: lean,
// but 15-25% of the ~101M GPT's step (docs/performance.md, "The allocator").
// With glibc left alone they stay in its heap, which a free rarely shrinks,
// and peak RSS grows by the heap's fragmentation (+13% at stage 3). A step
// allocates the same few sizes over and over, so a freed block is kept,
// whole and mapped, for the next request of its size class; each block is
// its own mapping, so giving one back to the OS is one munmap, whatever its
// neighbours hold.
//
// The bound on memory: a request no cached block fits is mapped afresh, but
// first the least recently freed blocks are unmapped until the bytes mapped
// (in use, cached and the new block) are at most the most ever in use plus
// `slack`. Memory mapped for the same purpose outside the cache (stage 3's
// gathered params, the engine's flat buffers: memory/page_buffer.h) is told
// to it (`note_outside`) and counts as in use, so a cached block also makes
// room for those. So the cache reuses memory the process already held at
// its peak and never adds to it beyond `slack` (counted in size classes; a
// class rounds up by at most 1/16). Frees never unmap; only a miss, a note
// of more memory outside, `release_cached()` or the destructor does.
//
// A miss that would give cached blocks back takes the pages of one of them
// instead: that block is resized (mremap) to the request, keeping its
// resident pages, and only the rest is unmapped. The sizes of a backward
// differ from its forward's (stage 3's most: its gathered units come and go
// beside them), so without this each such miss cleared fresh pages while the
// same number of resident ones went back to the OS. A block's old bytes are
// not cleared (nor are malloc's).
//
// Thread-safe (one mutex: large blocks are few, their allocations rare
// against the work done on them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace zero::memory {

struct LargeBlockCacheStats {
  uint64_t hits = 0;       // requests served by a cached block
  uint64_t maps = 0;       // requests served by a new mapping
  uint64_t unmaps = 0;     // cached blocks given back to the OS
  uint64_t resizes = 0;    // misses served by a cached block resized, its pages kept
  size_t live_bytes = 0;   // in blocks handed out and not freed (class sizes)
  size_t cached_bytes = 0; // in freed blocks kept mapped
  size_t outside_bytes = 0;      // mapped outside the cache (note_outside)
  size_t peak_live_bytes = 0;    // the most ever in use at once, outside included
  size_t peak_mapped_bytes = 0;  // the most ever mapped: in use, outside and cached
};

class LargeBlockCache {
 public:
  // `resize_on_miss`: a miss takes the pages of a block it would give back
  // (above); false: it maps afresh (for measuring what that saves).
  explicit LargeBlockCache(size_t slack_bytes, bool resize_on_miss = true)
      : slack_(slack_bytes), resize_on_miss_(resize_on_miss) {}
  ~LargeBlockCache();  // unmaps the cached blocks; live ones stay their owners'
  LargeBlockCache(const LargeBlockCache&) = delete;
  LargeBlockCache& operator=(const LargeBlockCache&) = delete;

  // The bytes a request of `bytes` maps: whole pages, rounded up to 1/16 of
  // the request's power of two, so sizes that differ by a few elements share
  // a class (at most 6.25% more, untouched pages of a fresh block not
  // resident at all).
  static size_t size_class(size_t bytes);

  // A page-aligned block of at least `bytes`; throws std::bad_alloc when the
  // OS refuses the mapping (after giving back every cached block).
  void* allocate(size_t bytes);
  // Takes a block back if it is one of this cache's (true), else false.
  bool free(void* block);
  // `bytes` more (or, negative, fewer) are mapped outside the cache; before
  // more, cached blocks are given back as a miss would.
  void note_outside(std::ptrdiff_t bytes);
  // Unmaps every cached block.
  void release_cached();
  LargeBlockCacheStats stats() const;

 private:
  struct Cached {
    void* block;
    size_t bytes;
  };
  using Lru = std::list<Cached>;  // least recently freed first

  void unmap_oldest_locked();
  // The bytes in use (outside included), its peak raised to them.
  size_t note_in_use_locked();
  // Raises the peak mapped to the bytes mapped now.
  void note_mapped_locked();
  // On a miss of `size` (counted in use already): of the blocks fit_locked
  // would unmap, the one keeping the most pages, resized to `size`; null
  // where none would be unmapped or the kernel refuses.
  void* resize_one_to_be_unmapped_locked(size_t size);
  // Unmaps the oldest cached blocks until in use (outside included) plus
  // cached is within the peak in use plus the slack.
  void fit_locked();

  const size_t slack_;
  const bool resize_on_miss_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;  // block -> its class size
  Lru lru_;
  std::unordered_map<size_t, std::vector<Lru::iterator>> by_size_;  // most recently freed last
  LargeBlockCacheStats stats_;
};

}  // namespace zero::memory

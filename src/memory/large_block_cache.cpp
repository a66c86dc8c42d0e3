#include "memory/large_block_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>

namespace zero::memory {

namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

LargeBlockCache::~LargeBlockCache() { release_cached(); }

size_t LargeBlockCache::size_class(size_t bytes) {
  size_t pow2 = 1;  // the largest power of two not above `bytes`
  while (pow2 <= bytes / 2) pow2 *= 2;
  return round_up(bytes, std::max(page_size(), pow2 / 16));
}

void* LargeBlockCache::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_size_.find(size); it != by_size_.end() && !it->second.empty()) {
    const Lru::iterator cached = it->second.back();
    it->second.pop_back();
    void* block = cached->block;
    lru_.erase(cached);
    stats_.cached_bytes -= size;
    stats_.live_bytes += size;
    note_in_use_locked();
    live_.emplace(block, size);
    ++stats_.hits;
    return block;
  }
  // A miss: map a block only within the most ever in use (plus the slack),
  // giving back the least recently freed blocks first where it would not fit
  // -- or taking one of those blocks' pages.
  stats_.live_bytes += size;
  void* block = resize_on_miss_ ? resize_one_to_be_unmapped_locked(size) : nullptr;
  fit_locked();
  if (block != nullptr) {
    ++stats_.resizes;
  } else {
    block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED && !lru_.empty()) {  // what is cached may be what stands in the way
      while (!lru_.empty()) unmap_oldest_locked();
      block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (block == MAP_FAILED) {
      stats_.live_bytes -= size;
      throw std::bad_alloc();
    }
    ++stats_.maps;
  }
  live_.emplace(block, size);
  note_mapped_locked();
  return block;
}

bool LargeBlockCache::free(void* block) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = live_.find(block);
  if (it == live_.end()) return false;
  const size_t size = it->second;
  live_.erase(it);
  stats_.live_bytes -= size;
  stats_.cached_bytes += size;
  by_size_[size].push_back(lru_.insert(lru_.end(), Cached{block, size}));
  return true;
}

size_t LargeBlockCache::note_in_use_locked() {
  const size_t in_use = stats_.live_bytes + stats_.outside_bytes;
  stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, in_use);
  return in_use;
}

void LargeBlockCache::note_mapped_locked() {
  stats_.peak_mapped_bytes =
      std::max(stats_.peak_mapped_bytes, stats_.live_bytes + stats_.outside_bytes + stats_.cached_bytes);
}

void* LargeBlockCache::resize_one_to_be_unmapped_locked(size_t size) {
  const size_t in_use = note_in_use_locked();
  const size_t limit = stats_.peak_live_bytes + slack_;
  // fit_locked unmaps the oldest blocks until the bytes mapped are within
  // the limit: of those, the one whose pages cover most of the request.
  size_t mapped = in_use + stats_.cached_bytes;
  Lru::iterator chosen = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end() && mapped > limit; ++it) {
    mapped -= it->bytes;
    if (chosen == lru_.end() || std::min(it->bytes, size) > std::min(chosen->bytes, size)) chosen = it;
  }
  if (chosen == lru_.end()) return nullptr;
  const Cached taken = *chosen;
  std::vector<Lru::iterator>& same = by_size_[taken.bytes];
  same.erase(std::find(same.begin(), same.end(), chosen));
  lru_.erase(chosen);
  stats_.cached_bytes -= taken.bytes;
  // Shrinking gives the tail's pages back; growing adds untouched ones (and
  // may move the block, its pages with it).
  void* block = mremap(taken.block, taken.bytes, size, MREMAP_MAYMOVE);
  if (block != MAP_FAILED) return block;
  munmap(taken.block, taken.bytes);
  ++stats_.unmaps;
  return nullptr;
}

void LargeBlockCache::note_outside(std::ptrdiff_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes < 0) {
    stats_.outside_bytes -= std::min(stats_.outside_bytes, static_cast<size_t>(-bytes));
    return;
  }
  stats_.outside_bytes += static_cast<size_t>(bytes);
  fit_locked();
  note_mapped_locked();
}

void LargeBlockCache::fit_locked() {
  const size_t in_use = note_in_use_locked();
  while (!lru_.empty() && in_use + stats_.cached_bytes > stats_.peak_live_bytes + slack_) unmap_oldest_locked();
}

void LargeBlockCache::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!lru_.empty()) unmap_oldest_locked();
}

LargeBlockCacheStats LargeBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void LargeBlockCache::unmap_oldest_locked() {
  const Cached oldest = lru_.front();
  std::vector<Lru::iterator>& same = by_size_[oldest.bytes];
  // The oldest of its size is the first in its list.
  same.erase(same.begin());
  lru_.pop_front();
  munmap(oldest.block, oldest.bytes);
  stats_.cached_bytes -= oldest.bytes;
  ++stats_.unmaps;
}

}  // namespace zero::memory

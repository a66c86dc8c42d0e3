// The large-block cache (memory/large_block_cache.h): a freed block serves
// the next request of its size class, a miss takes the pages of a block it
// would give back, and the memory it keeps mapped never exceeds the peak in
// use plus its slack -- counted by the cache and measured as the process's
// resident set and its page faults.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "memory/large_block_cache.h"

namespace {

using zero::memory::LargeBlockCache;

constexpr size_t kMiB = size_t{1} << 20;

// The process's resident bytes now (/proc/self/statm's second field).
size_t resident_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr || std::fscanf(f, "%ld %ld", &pages, &resident) != 2) ADD_FAILURE() << "/proc/self/statm";
  if (f != nullptr) std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Page faults this process has taken so far (minor: no disk involved).
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// Writes a byte into every page of [p, p + n): the faults it takes are the
// pages that were not resident.
long faults_touching(void* p, size_t n) {
  const long before = minor_faults();
  auto* bytes = static_cast<volatile unsigned char*>(p);
  for (size_t i = 0; i < n; i += 4096) bytes[i] = bytes[i];
  return minor_faults() - before;
}

TEST(LargeBlockCache, SizeClassesRoundUpBySixteenthsOfAPowerOfTwo) {
  EXPECT_EQ(LargeBlockCache::size_class(kMiB), kMiB);
  EXPECT_EQ(LargeBlockCache::size_class(kMiB + 1), kMiB + kMiB / 16);
  EXPECT_EQ(LargeBlockCache::size_class(3 * kMiB - 5), 3 * kMiB);
  EXPECT_EQ(LargeBlockCache::size_class(100), static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  for (size_t n : {kMiB + 7, 5 * kMiB + 3, 77 * kMiB + 12345}) {
    EXPECT_GE(LargeBlockCache::size_class(n), n);
    EXPECT_LE(LargeBlockCache::size_class(n), n + n / 16 + 4096);
  }
}

TEST(LargeBlockCache, AFreedBlockServesTheNextRequestOfItsClass) {
  LargeBlockCache cache(64 * kMiB);
  void* a = cache.allocate(3 * kMiB);
  std::memset(a, 1, 3 * kMiB);
  EXPECT_TRUE(cache.free(a));
  void* b = cache.allocate(3 * kMiB - 100);  // the same class
  EXPECT_EQ(a, b);
  void* c = cache.allocate(3 * kMiB);  // b is live: a new block
  EXPECT_NE(c, b);
  const auto s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.maps, 2u);
  EXPECT_EQ(s.live_bytes, 6 * kMiB);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_TRUE(cache.free(b));
  EXPECT_TRUE(cache.free(c));
  int not_ours = 0;
  EXPECT_FALSE(cache.free(&not_ours));
  EXPECT_FALSE(cache.free(b));  // already free
}

TEST(LargeBlockCache, AMissGivesBackTheOldestCachedBlocksFirst) {
  LargeBlockCache cache(0, /*resize_on_miss=*/false);
  void* a = cache.allocate(4 * kMiB);
  void* b = cache.allocate(6 * kMiB);  // 10 MiB in use at the peak
  cache.free(a);                       // oldest
  cache.free(b);
  // 3 MiB fits neither: 3 + 10 cached is over the peak of 10, so a (the
  // oldest) goes; 3 + 6 fits.
  void* c = cache.allocate(3 * kMiB);
  auto s = cache.stats();
  EXPECT_EQ(s.unmaps, 1u);
  EXPECT_EQ(s.cached_bytes, 6 * kMiB);
  EXPECT_EQ(cache.allocate(6 * kMiB), b);  // b stayed
  cache.free(c);
  cache.free(b);
  // The peak (10) grows to 12 with 12 MiB in use: nothing needs to go for it.
  void* d = cache.allocate(12 * kMiB);
  s = cache.stats();
  EXPECT_EQ(s.unmaps, 3u);  // 12 + 9 cached > 12: both cached blocks go
  EXPECT_EQ(s.peak_live_bytes, 12 * kMiB);
  cache.free(d);
  cache.release_cached();
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
}

// Memory mapped outside the cache (stage 3's gathered params) counts as in
// use: cached blocks make room for it as for a miss, so the two together
// stay within their peak.
TEST(LargeBlockCache, CachedBlocksMakeRoomForMemoryMappedOutside) {
  LargeBlockCache cache(0);
  void* a = cache.allocate(8 * kMiB);
  void* b = cache.allocate(8 * kMiB);
  cache.free(a);
  cache.free(b);  // 16 MiB cached, the peak in use
  cache.note_outside(4 * kMiB);  // 4 + 16 > 16: a goes
  auto s = cache.stats();
  EXPECT_EQ(s.unmaps, 1u);
  EXPECT_EQ(s.cached_bytes, 8 * kMiB);
  EXPECT_EQ(s.outside_bytes, 4 * kMiB);
  EXPECT_EQ(cache.allocate(8 * kMiB), b);  // a hit: 4 + 8 in use, nothing to give back
  cache.note_outside(-4 * static_cast<std::ptrdiff_t>(kMiB));
  s = cache.stats();
  EXPECT_EQ(s.outside_bytes, 0u);
  EXPECT_EQ(s.unmaps, 1u);
  EXPECT_LE(s.peak_mapped_bytes, s.peak_live_bytes);
  cache.free(b);
}

// Sizes that never repeat, each block filled: without giving back cached
// blocks on a miss the process would hold every one of them (~230 MiB).
TEST(LargeBlockCache, ResidentMemoryStaysAtThePeakInUseWhenSizesChange) {
  LargeBlockCache cache(0);
  const size_t before = resident_bytes();
  size_t largest = 0;
  for (size_t i = 1; i <= 20; ++i) {
    const size_t n = (i + 1) * kMiB + i * 4096;
    void* p = cache.allocate(n);
    std::memset(p, static_cast<int>(i), n);
    cache.free(p);
    largest = std::max(largest, n);
  }
  const size_t grew = resident_bytes() - std::min(before, resident_bytes());
  EXPECT_LE(grew, largest + largest / 8) << "resident grew by " << grew / kMiB << " MiB";
  // Each miss takes the last block's pages (and grows it): one mapping.
  EXPECT_EQ(cache.stats().maps, 1u);
  EXPECT_EQ(cache.stats().resizes, 19u);
  EXPECT_EQ(cache.stats().unmaps, 0u);
}

// A miss that would give a cached block back takes its pages: resized, the
// block keeps what is resident (its old bytes, no page cleared or faulted
// in afresh); shrunk, its tail goes back to the OS.
TEST(LargeBlockCache, AMissTakesThePagesOfABlockItWouldGiveBack) {
  LargeBlockCache cache(0);
  void* a = cache.allocate(8 * kMiB);
  std::memset(a, 0xab, 8 * kMiB);
  cache.free(a);  // 8 MiB cached, the peak in use
  const size_t resident_before = resident_bytes();
  // 6 + 8 cached is over the peak of 8: a would go; its pages serve b.
  auto* b = static_cast<unsigned char*>(cache.allocate(6 * kMiB));
  auto s = cache.stats();
  EXPECT_EQ(s.maps, 1u);
  EXPECT_EQ(s.resizes, 1u);
  EXPECT_EQ(s.unmaps, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(b[0], 0xab);
  EXPECT_EQ(b[6 * kMiB - 1], 0xab);
  EXPECT_LT(faults_touching(b, 6 * kMiB), 16) << "b's pages were not a's";
  EXPECT_LE(resident_bytes(), resident_before) << "a's tail stayed resident";
  cache.free(b);
  // Grown: the first 6 MiB keep their pages; the rest are new.
  auto* c = static_cast<unsigned char*>(cache.allocate(10 * kMiB));
  s = cache.stats();
  EXPECT_EQ(s.maps, 1u);
  EXPECT_EQ(s.resizes, 2u);
  EXPECT_EQ(c[6 * kMiB - 1], 0xab);
  EXPECT_LT(faults_touching(c, 6 * kMiB), 16);
  EXPECT_GT(faults_touching(c + 6 * kMiB, 4 * kMiB), 0);
  cache.free(c);
}

// Of the blocks a miss would give back (the least recently freed, until the
// bytes mapped fit), it takes the one whose pages cover most of it; the
// others go only as far as the bound needs.
TEST(LargeBlockCache, AMissTakesTheBlockThatKeepsTheMostPages) {
  LargeBlockCache cache(0);
  void* a = cache.allocate(2 * kMiB);
  void* b = cache.allocate(8 * kMiB);
  void* c = cache.allocate(4 * kMiB);  // 14 MiB in use at the peak
  std::memset(b, 0xbb, 8 * kMiB);
  cache.free(a);  // oldest
  cache.free(b);
  cache.free(c);
  // 6 + 14 cached is over 14: a, then b would go (6 + 4 fits). b covers 6
  // MiB of the request, a 2: b is taken, and a need not go at all.
  auto* d = static_cast<unsigned char*>(cache.allocate(6 * kMiB));
  const auto s = cache.stats();
  EXPECT_EQ(d[0], 0xbb);
  EXPECT_EQ(s.resizes, 1u);
  EXPECT_EQ(s.unmaps, 0u);
  EXPECT_EQ(s.cached_bytes, 6 * kMiB);
  EXPECT_EQ(cache.allocate(2 * kMiB), a);
  EXPECT_EQ(cache.allocate(4 * kMiB), c);
}

// A random mix of sizes and lifetimes: blocks never overlap (each keeps the
// bytes written into it until freed), and the bytes mapped never exceed the
// peak in use plus the slack.
TEST(LargeBlockCache, RandomTrafficKeepsBlocksApartAndTheBound) {
  constexpr size_t kSlack = 16 * kMiB;
  LargeBlockCache cache(kSlack);
  std::mt19937 rng(7);
  const size_t sizes[] = {kMiB, kMiB + 4096, 2 * kMiB, 3 * kMiB + 100, 8 * kMiB, 12 * kMiB};
  std::map<void*, std::pair<size_t, unsigned char>> live;  // block -> size, fill byte
  size_t live_classes = 0, peak_live = 0;
  for (int op = 0; op < 3000; ++op) {
    if (live.size() < 12 && (live.empty() || rng() % 2 == 0)) {
      const size_t n = sizes[rng() % std::size(sizes)];
      void* p = cache.allocate(n);
      ASSERT_EQ(live.count(p), 0u) << "a live block handed out again";
      const auto fill = static_cast<unsigned char>(op);
      auto* bytes = static_cast<unsigned char*>(p);
      bytes[0] = bytes[n / 2] = bytes[n - 1] = fill;
      live[p] = {n, fill};
      live_classes += LargeBlockCache::size_class(n);
      peak_live = std::max(peak_live, live_classes);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const auto [n, fill] = it->second;
      const auto* bytes = static_cast<const unsigned char*>(it->first);
      ASSERT_EQ(bytes[0], fill);
      ASSERT_EQ(bytes[n / 2], fill);
      ASSERT_EQ(bytes[n - 1], fill);
      ASSERT_TRUE(cache.free(it->first));
      live_classes -= LargeBlockCache::size_class(n);
      live.erase(it);
    }
  }
  const auto s = cache.stats();
  EXPECT_GT(s.resizes, 0u);  // the traffic walked the resizing path too
  EXPECT_EQ(s.peak_live_bytes, peak_live);
  EXPECT_LE(s.peak_mapped_bytes, peak_live + kSlack);
  EXPECT_EQ(s.live_bytes, live_classes);
  for (auto& [p, info] : live) cache.free(p);
}

// A training step: the same sizes allocated and freed in the same order
// every time (forward's activations held until backward frees them, scratch
// in between). Each size class needs its own most-at-once blocks, 163 MiB
// here against a peak of 122 MiB in use: with that much slack, every request
// after the first step finds its block. With none, each step maps again.
TEST(LargeBlockCache, RepeatedStepsMapNothingAfterTheFirstGivenSlack) {
  LargeBlockCache cache(48 * kMiB);
  const size_t activations[] = {2 * kMiB, 8 * kMiB, 2 * kMiB, 8 * kMiB, 2 * kMiB, 50 * kMiB};
  auto step = [&] {
    std::vector<void*> held;
    for (size_t n : activations) {
      held.push_back(cache.allocate(n));
      void* scratch = cache.allocate(n / 2 + 4096);
      cache.free(scratch);
    }
    while (!held.empty()) {  // backward: grads of each activation, then free it
      void* grad = cache.allocate(activations[held.size() - 1]);
      cache.free(grad);
      cache.free(held.back());
      held.pop_back();
    }
  };
  step();
  const auto first = cache.stats();
  for (int i = 0; i < 5; ++i) step();
  const auto s = cache.stats();
  EXPECT_EQ(s.maps, first.maps);
  EXPECT_EQ(s.resizes, first.resizes);
  EXPECT_EQ(s.unmaps, first.unmaps);
  EXPECT_EQ(s.peak_mapped_bytes, first.peak_mapped_bytes);
}

}  // namespace

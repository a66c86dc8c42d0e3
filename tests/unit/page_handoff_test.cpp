// Stage 3's hand-over of a released unit's pages to the next unit gathered
// (memory/page_buffer.h hold_pages, take_held_pages): the taker gets the
// held buffer's pages -- its bytes, and no new resident memory -- and the
// held buffer is inaccessible while held and released after; a restore of
// a held buffer still gives zeros; buffers of another size, shared ones,
// and device-less fallbacks are refused with nothing changed.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include "memory/page_buffer.h"

namespace {

using namespace zero::memory;

constexpr int64_t kNumel = int64_t{4} << 20;  // 16 MiB of fp32: whole 2 MiB pages
constexpr int64_t kBytes = kNumel * 4;

int64_t resident_now() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The permissions /proc/self/maps gives the page at `p` ("rw-p", "---p").
std::string protection_at(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && addr >= lo && addr < hi) return perms;
  }
  return "unmapped";
}

#define SKIP_WITHOUT_HANDOFFS() \
  if (!page_handoffs_possible()) GTEST_SKIP() << "no page hand-over here (ZERO_KEEP_FREED_PAGES=off, or Linux < 5.7)"

at::Tensor released_buffer(int64_t numel = kNumel) {
  at::Tensor t = zeros_flat(numel, at::kFloat, at::kCPU, /*shared=*/false);
  release_pages(t);
  return t;
}

TEST(PageHandoff, ATakerGetsTheHeldPagesAndTheirBytesWithNoNewMemory) {
  SKIP_WITHOUT_HANDOFFS();
  at::Tensor a = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/false);
  a.fill_(7.0f);
  at::Tensor b = released_buffer();
  const void* a_data = a.data_ptr();
  // 2 MiB-aligned, as b: the move carries whole huge pages.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a_data) % (2 << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % (2 << 20), 0u);
  ASSERT_TRUE(hold_pages(a));
  EXPECT_TRUE(pages_released(a));
  EXPECT_EQ(protection_at(a_data), "---p") << "a held buffer is inaccessible, as a released one";
  EXPECT_EQ(resident_bytes(a), kBytes) << "its pages are still in memory";

  const uint64_t handoffs = page_handoffs();
  const int64_t before = resident_now();
  ASSERT_TRUE(take_held_pages(b, a));
  EXPECT_LT(resident_now() - before, kBytes / 8) << "b took a's pages instead of new ones";
  EXPECT_EQ(page_handoffs(), handoffs + 1);
  EXPECT_FALSE(pages_released(b));
  EXPECT_EQ(b.min().item<float>(), 7.0f) << "b holds a's old bytes: nothing was cleared";
  EXPECT_EQ(b.max().item<float>(), 7.0f);
  EXPECT_TRUE(pages_released(a));
  EXPECT_EQ(resident_bytes(a), 0);
  EXPECT_EQ(protection_at(a_data), "---p") << "a keeps its address, inaccessible";

  // a comes back as any released buffer does: zero-filled, its own pages.
  restore_pages(a);
  EXPECT_EQ(a.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(b.min().item<float>(), 7.0f);
}

TEST(PageHandoff, ARestoreOfAHeldBufferClearsIt) {
  SKIP_WITHOUT_HANDOFFS();
  at::Tensor a = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/false);
  a.fill_(3.0f);
  ASSERT_TRUE(hold_pages(a));
  restore_pages(a);
  EXPECT_FALSE(pages_released(a));
  EXPECT_EQ(a.abs().max().item<float>(), 0.0f) << "restore_pages promises zeros, held or not";
}

TEST(PageHandoff, AHeldBufferTakenBackByItselfKeepsItsBytes) {
  SKIP_WITHOUT_HANDOFFS();
  at::Tensor a = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/false);
  a.fill_(5.0f);
  const uint64_t handoffs = page_handoffs();
  ASSERT_TRUE(hold_pages(a));
  ASSERT_TRUE(take_held_pages(a, a));
  EXPECT_FALSE(pages_released(a));
  EXPECT_EQ(protection_at(a.data_ptr()), "rw-p");
  EXPECT_EQ(a.min().item<float>(), 5.0f);
  EXPECT_EQ(page_handoffs(), handoffs) << "no pages moved";
}

TEST(PageHandoff, OnlyAReleasedPrivateBufferOfTheSameSizeTakes) {
  SKIP_WITHOUT_HANDOFFS();
  at::Tensor a = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/false);
  a.fill_(1.0f);
  ASSERT_TRUE(hold_pages(a));
  EXPECT_FALSE(hold_pages(a)) << "held already";

  at::Tensor smaller = released_buffer(kNumel / 2);
  EXPECT_FALSE(take_held_pages(smaller, a));
  EXPECT_TRUE(pages_released(smaller));
  at::Tensor same_pages = released_buffer(kNumel - 1);  // one float short: the same pages, not the same size
  EXPECT_FALSE(take_held_pages(same_pages, a));
  EXPECT_TRUE(pages_released(same_pages));
  at::Tensor resident = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/false);
  EXPECT_FALSE(take_held_pages(resident, a)) << "a resident buffer has pages of its own";
  at::Tensor plain = at::zeros({kNumel});
  EXPECT_FALSE(take_held_pages(plain, a)) << "not page-backed";
  EXPECT_FALSE(hold_pages(plain));

  // Shared buffers, which peers map by their range, are never held.
  at::Tensor shared = zeros_flat(kNumel, at::kFloat, at::kCPU, /*shared=*/true);
  EXPECT_FALSE(hold_pages(shared));
  EXPECT_FALSE(pages_released(shared));

  // Refusals changed nothing: a still holds its pages and bytes.
  at::Tensor b = released_buffer();
  ASSERT_TRUE(take_held_pages(b, a));
  EXPECT_EQ(b.min().item<float>(), 1.0f);
}

}  // namespace

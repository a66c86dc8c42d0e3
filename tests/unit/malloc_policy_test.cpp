// The engine fixes glibc's mmap threshold (src/memory/malloc_policy.h): a
// block above it must come from mmap (and go back to the OS when freed) even
// after a larger block was freed, which is exactly what glibc's moving
// threshold does not do. Each case runs in a child process, since the
// threshold is process-wide.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "memory/malloc_policy.h"

#if defined(__GLIBC__)
#include <malloc.h>

namespace {

// Frees a block twice the size of the one it then allocates, and exits 0
// if that one is mmap'd (glibc counts mmap'd blocks in mallinfo2().hblks),
// 1 if not; 3 if the heap's free memory is too large for the check. The
// block is larger than all free heap memory, so only its size decides.
void* volatile g_sink;  // keeps the compiler from eliding the malloc/free pairs

[[noreturn]] void exit_whether_mmapped_after_a_larger_free() {
  malloc_trim(0);
  const size_t size = std::max<size_t>(4 << 20, mallinfo2().fordblks + (1 << 20));
  if (2 * size > (32 << 20)) std::exit(3);  // above 32 MiB glibc always mmaps
  void* big = std::malloc(2 * size);
  std::memset(big, 1, 2 * size);
  g_sink = big;
  std::free(g_sink);
  const size_t before = mallinfo2().hblks;
  g_sink = std::malloc(size);
  const bool mmapped = mallinfo2().hblks == before + 1;
  std::free(g_sink);
  std::exit(mmapped ? 0 : 1);
}

TEST(MallocPolicyDeathTest, FixedThresholdKeepsLargeBlocksReturnable) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_")) GTEST_SKIP() << "the environment fixes the threshold already";
  // glibc alone: the free raised the threshold, the 4 MiB block is heap memory.
  EXPECT_EXIT(exit_whether_mmapped_after_a_larger_free(), testing::ExitedWithCode(1), "");
  // Fixed at 1 MiB: it is mmap'd.
  EXPECT_EXIT(
      {
        if (!zero::memory::fix_mmap_threshold(1 << 20)) std::exit(2);
        exit_whether_mmapped_after_a_larger_free();
      },
      testing::ExitedWithCode(0), "");
  // 0 leaves glibc's behaviour as it is.
  EXPECT_EXIT(
      {
        if (zero::memory::fix_mmap_threshold(0)) std::exit(2);
        exit_whether_mmapped_after_a_larger_free();
      },
      testing::ExitedWithCode(1), "");
}

}  // namespace
#endif

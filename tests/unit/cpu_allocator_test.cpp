// The CPU allocator the engine installs (memory/cpu_allocator.h): once a
// step's tensors have been made, later steps of the same shapes fault no
// new pages in -- what the caching allocator is for -- while torch's
// allocator under the fixed mmap threshold maps (and faults in) every large
// tensor afresh. Each case runs in a child process: the allocator and the
// threshold are process-wide.
#include <algorithm>
#include <cstdlib>
#include <string>

#include <sys/resource.h>
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include "memory/cpu_allocator.h"
#include "memory/malloc_policy.h"

namespace {

using zero::CpuAllocator;

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// A step's worth of large transient tensors: a small MLP's forward and a
// hand-written backward on 2-16 MiB activations.
double one_step(const at::Tensor& w1, const at::Tensor& w2) {
  at::Tensor x = at::ones({512, 1024});
  at::Tensor h = at::relu(at::mm(x, w1));   // 512 x 4096: 8 MiB
  at::Tensor y = at::mm(h, w2);             // 512 x 1024: 2 MiB
  at::Tensor dh = at::mm(y, w2.t()) * (h > 0);
  at::Tensor dw1 = at::mm(x.t(), dh);       // 1024 x 4096: 16 MiB
  return dw1.sum().item<double>();
}

// Exits with the minor faults per step over steps 3-7, capped at 250.
[[noreturn]] void exit_with_faults_per_steady_step() {
  at::set_num_threads(1);
  const at::Tensor w1 = at::full({1024, 4096}, 1e-3);
  const at::Tensor w2 = at::full({4096, 1024}, 1e-3);
  for (int i = 0; i < 2; ++i) one_step(w1, w2);
  const long before = minor_faults();
  for (int i = 0; i < 5; ++i) one_step(w1, w2);
  std::exit(static_cast<int>(std::min<long>((minor_faults() - before) / 5 / 100, 250)));
}

// A step faults in ~8.6k pages of large tensors; exit codes are hundreds of faults.
TEST(CpuAllocatorDeathTest, CachingFaultsNoPagesInAfterTheFirstSteps) {
  // The oracle can fail: torch's allocator with the fixed threshold faults
  // every large tensor in, every step.
  EXPECT_EXIT(
      {
        zero::memory::fix_mmap_threshold(1 << 20);
        if (!zero::memory::use_cpu_allocator(CpuAllocator::Torch)) std::exit(255);
        exit_with_faults_per_steady_step();
      },
      [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) >= 40 && WEXITSTATUS(status) != 255; }, "");
  EXPECT_EXIT(
      {
        zero::memory::fix_mmap_threshold(1 << 20);
        if (!zero::memory::use_cpu_allocator(CpuAllocator::Caching)) std::exit(255);
        exit_with_faults_per_steady_step();
      },
      [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) <= 2; }, "");
}

TEST(CpuAllocator, TensorsOutliveASwitchAndTheirBlocksGoBack) {
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Caching));
  EXPECT_EQ(zero::memory::current_cpu_allocator(), CpuAllocator::Caching);
  const size_t live_before = zero::memory::cpu_large_block_stats().live_bytes;
  at::Tensor big = at::arange(1 << 20, at::kFloat);  // 4 MiB: cached
  at::Tensor small = at::arange(1000, at::kFloat);   // torch's own
  EXPECT_GE(zero::memory::cpu_large_block_stats().live_bytes, live_before + (4u << 20));
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Torch));
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  EXPECT_EQ(big[(1 << 20) - 1].item<float>(), static_cast<float>((1 << 20) - 1));
  EXPECT_EQ(small[999].item<float>(), 999.0f);
  big.reset();
  small.reset();
  EXPECT_EQ(zero::memory::cpu_large_block_stats().live_bytes, live_before);
  // Clone goes through the allocator's copy: a cached block copied whole.
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Caching));
  at::Tensor a = at::full({1 << 19}, 3.0f);
  EXPECT_TRUE(at::equal(a.clone(), a));
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Torch));
}

// More than the address space can map: torch's own out-of-memory error,
// naming the size, and the cache still serves the next request.
TEST(CpuAllocator, OutOfMemoryIsTorchsError) {
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Caching));
  try {
    at::Tensor huge = at::empty({int64_t{1} << 50}, at::kByte);  // 1 PiB
    ADD_FAILURE() << "1 PiB allocated";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("1125899906842624 bytes"), std::string::npos) << e.what();
  }
  at::Tensor fine = at::ones({1 << 20});
  EXPECT_EQ(fine.sum().item<float>(), static_cast<float>(1 << 20));
  ASSERT_TRUE(zero::memory::use_cpu_allocator(CpuAllocator::Torch));
}

}  // namespace

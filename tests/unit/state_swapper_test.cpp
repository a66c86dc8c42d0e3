// offload::StateSwapper, alone: state goes to its swap file and comes back
// byte for byte; acquires nest, and the slot is written back when its last
// user releases it if any user changed it; the file never has a name; a
// release without an acquire is a bug said as one. An Empty slot (adopted
// empty, or discarded) reads as zeros without I/O and stays Empty when
// released clean; an overwriting acquire does not read what is on disk.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "memory/page_buffer.h"
#include "offload/state_swapper.h"

namespace zero::offload {
namespace {

namespace fs = std::filesystem;

struct SwapDir {
  std::string path = (fs::temp_directory_path() / ("zero-state-swapper-" + std::to_string(getpid()))).string();
  SwapDir() { fs::create_directories(path); }
  ~SwapDir() { fs::remove_all(path); }
};

SwapperOptions options(const std::string& dir) {
  SwapperOptions o;
  o.nvme_path = dir;
  o.aio.block_size = 8192;
  o.aio.queue_depth = 4;
  return o;
}

at::Tensor paged(int64_t numel, at::ScalarType dtype) {
  return memory::zeros_flat(numel, dtype, at::kCPU, /*shared=*/false);
}

TEST(StateSwapper, StateComesBackByteForByteInAnyDtype) {
  SwapDir dir;
  StateSwapper swapper(options(dir.path));
  at::Tensor a = paged(10'000, at::kFloat), b = paged(7'777, at::kBFloat16);
  a.copy_(at::randn({10'000}));
  b.copy_(at::randn({7'777}).to(at::kBFloat16));
  const at::Tensor want_a = a.clone(), want_b = b.clone();
  const int slot = swapper.adopt({a, b}, "two tensors");
  EXPECT_EQ(swapper.resident_slots(), 0);
  EXPECT_EQ(memory::resident_bytes(a), 0);
  EXPECT_TRUE(fs::is_empty(dir.path));  // unlinked at once: nothing to leave behind
  swapper.acquire(slot);
  EXPECT_TRUE(a.equal(want_a));
  EXPECT_TRUE(b.equal(want_b));
  swapper.release(slot, /*dirty=*/false);
  EXPECT_EQ(swapper.resident_slots(), 0);
}

TEST(StateSwapper, NestedAcquiresWriteBackWhenTheLastUserReleases) {
  SwapDir dir;
  StateSwapper swapper(options(dir.path));
  at::Tensor t = paged(4096, at::kFloat);
  const int slot = swapper.adopt({t}, "nested");
  swapper.acquire(slot);
  swapper.acquire(slot);  // e.g. a checkpoint scope around a gather
  t.fill_(3.0);
  swapper.release(slot, /*dirty=*/true);
  EXPECT_EQ(swapper.resident_slots(), 1) << "still in use by the outer acquire";
  EXPECT_TRUE(t.eq(3.0).all().item<bool>());
  swapper.release(slot, /*dirty=*/false);  // the outer user changed nothing, the inner did
  swapper.flush();
  EXPECT_EQ(swapper.resident_slots(), 0);
  swapper.acquire(slot);
  EXPECT_TRUE(t.eq(3.0).all().item<bool>()) << "the inner change was written back";
  swapper.release(slot, false);
  EXPECT_THROW(swapper.release(slot, false), std::logic_error);
}

TEST(StateSwapper, EmptySlotsReadAsZerosAndDiscardForgetsTheDiskCopy) {
  SwapDir dir;
  StateSwapper swapper(options(dir.path));
  at::Tensor t = paged(5000, at::kFloat);
  const int slot = swapper.adopt_empty({t}, "grads");
  EXPECT_EQ(swapper.resident_slots(), 0);
  EXPECT_EQ(memory::resident_bytes(t), 0);
  swapper.acquire(slot);
  EXPECT_TRUE(t.eq(0.0).all().item<bool>());
  swapper.release(slot, /*dirty=*/false);  // nothing written: still Empty, its pages released
  EXPECT_EQ(swapper.resident_slots(), 0);
  EXPECT_EQ(memory::resident_bytes(t), 0);
}

TEST(StateSwapper, OverwriteSkipsTheReadAndDiscardMakesZeros) {
  SwapDir dir;
  StateSwapper swapper(options(dir.path));
  at::Tensor t = paged(5000, at::kFloat);
  const int slot = swapper.adopt_empty({t}, "grads");
  swapper.acquire(slot, StateSwapper::Contents::Overwrite);
  t.fill_(7.0);
  swapper.release(slot, /*dirty=*/true);
  swapper.flush();
  swapper.acquire(slot);
  EXPECT_TRUE(t.eq(7.0).all().item<bool>()) << "written and read back";
  swapper.release(slot, false);
  swapper.acquire(slot, StateSwapper::Contents::Overwrite);
  EXPECT_TRUE(t.eq(0.0).all().item<bool>()) << "an overwriting acquire read the disk copy";
  swapper.release(slot, false);
  EXPECT_THROW(
      {
        swapper.acquire(slot);
        try {
          swapper.discard(slot);
        } catch (...) {
          swapper.release(slot, false);
          throw;
        }
      },
      std::logic_error)
      << "discarding a slot in use";
  swapper.prefetch(slot);  // a read in flight when it is discarded
  swapper.discard(slot);
  EXPECT_EQ(swapper.resident_slots(), 0);
  swapper.acquire(slot);
  EXPECT_TRUE(t.eq(0.0).all().item<bool>()) << "a discarded slot reads as zeros";
  swapper.release(slot, false);
}

TEST(StateSwapper, ABadDirectoryIsNamedWithItsKey) {
  SwapperOptions o = options("/nonexistent/zero-swap");
  o.config_key = "zero_optimization.offload_param";
  try {
    StateSwapper swapper(o);
    ADD_FAILURE() << "opened a swap file in a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.nvme_path \"/nonexistent/zero-swap\" does "
                                         "not exist"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::offload

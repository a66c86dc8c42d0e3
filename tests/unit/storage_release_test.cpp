// Stage 3's release and regather of a flat buffer outside page-backed host
// memory (memory/storage_release.h; device buffers on a GPU). Host tensors
// with libtorch's own allocator stand in for device ones: the mechanism is
// the storage's, whatever its allocator.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <gtest/gtest.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "memory/storage_release.h"

namespace {

using zero::memory::release_storage;
using zero::memory::restore_storage;
using zero::memory::storage_released;

// An allocator whose fresh blocks hold 0xFF bytes (NaN as fp32): what a
// restore leaves in the buffer is then visible.
struct PoisoningAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = std::malloc(n ? n : 1);
    std::memset(p, 0xFF, n);
    ++allocations;
    return {p, p, &std::free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &std::free; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
  int allocations = 0;
};

at::Tensor flat_on(c10::Allocator& a, int64_t numel) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), numel * sizeof(float), &a, /*resizable=*/true);
  return at::empty({0}, at::kFloat).set_(storage, 0, {numel}, {1});
}

TEST(StorageRelease, FreesTheBlockAndRestoresItUnwritten) {
  PoisoningAllocator poison;
  at::Tensor flat = flat_on(poison, 8);
  flat.copy_(at::arange(8, at::kFloat));
  EXPECT_FALSE(storage_released(flat));
  release_storage(flat);
  EXPECT_TRUE(storage_released(flat));
  EXPECT_EQ(flat.storage().nbytes(), 0u);
  release_storage(flat);  // twice: nothing more to give back
  restore_storage(flat);
  EXPECT_FALSE(storage_released(flat));
  EXPECT_EQ(flat.storage().nbytes(), 8 * sizeof(float));
  EXPECT_EQ(poison.allocations, 2) << "one fresh block from the buffer's own allocator";
  // The gather that follows overwrites all of it: no zero-fill pass first.
  EXPECT_TRUE(flat.isnan().all().item<bool>()) << "the block was written on restore: " << flat;
  flat.fill_(3);
  restore_storage(flat);  // not released: the data stays
  EXPECT_TRUE(flat.eq(3).all().item<bool>());
}

// A param that views the buffer, and the copy of it autograd saved for
// backward, both read what the buffer holds after the regather -- what
// stage 3 relies on between a unit's forward and its backward.
TEST(StorageRelease, ViewsAndSavedTensorsSeeTheRegatheredData) {
  at::Tensor flat = at::arange(8, at::kFloat);
  at::Tensor p = at::zeros({2, 2}).set_requires_grad(true);
  {
    at::NoGradGuard no_grad;
    p.set_data(flat.narrow(0, 2, 4).view({2, 2}));
  }
  at::Tensor x = at::ones({2, 2}).set_requires_grad(true);
  at::Tensor y = (p * x).sum();  // saves p for x's grad
  release_storage(flat);
  EXPECT_EQ(p.storage().nbytes(), 0u) << "the param's storage is the buffer's";
  restore_storage(flat);
  {
    at::NoGradGuard no_grad;
    flat.copy_(at::arange(8, at::kFloat) * 10);  // the gather
  }
  y.backward();
  EXPECT_TRUE(x.grad().equal(at::tensor({20.0f, 30.0f, 40.0f, 50.0f}).view({2, 2}))) << x.grad();
  EXPECT_TRUE(p.detach().equal(x.grad()));
}

TEST(StorageRelease, OnlyABufferThatStartsItsStorage) {
  at::Tensor flat = at::arange(8, at::kFloat);
  at::Tensor tail = flat.narrow(0, 4, 4);
  release_storage(flat);
  EXPECT_THROW(restore_storage(tail), std::logic_error);
  restore_storage(flat);
}

}  // namespace

// Stage 3's release and regather of a flat buffer outside page-backed host
// memory (memory/storage_release.h; device buffers on a GPU). Host tensors
// with libtorch's own allocator stand in for device ones: the mechanism is
// the storage's, whatever its allocator.
#include <gtest/gtest.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "memory/storage_release.h"

namespace {

using zero::memory::release_storage;
using zero::memory::restore_storage;
using zero::memory::storage_released;

TEST(StorageRelease, FreesTheBlockAndRestoresZeroFilled) {
  at::Tensor flat = at::arange(8, at::kFloat);
  EXPECT_FALSE(storage_released(flat));
  release_storage(flat);
  EXPECT_TRUE(storage_released(flat));
  EXPECT_EQ(flat.storage().nbytes(), 0u);
  release_storage(flat);  // twice: nothing more to give back
  restore_storage(flat);
  EXPECT_FALSE(storage_released(flat));
  EXPECT_EQ(flat.storage().nbytes(), 8 * sizeof(float));
  EXPECT_TRUE(flat.eq(0).all().item<bool>()) << "restored zero-filled";
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

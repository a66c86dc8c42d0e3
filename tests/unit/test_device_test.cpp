// zdev, the test device (tests/support/test_device.h): that it computes what
// the CPU computes, and that it refuses what a CUDA device would refuse --
// a CPU tensor in a device op, memory allocated on another device than its
// tensor's -- so that tests of the device path fail here as they would on
// a GPU.
#include <gtest/gtest.h>
#include <vector>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <thread>
#include <tuple>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include "support/test_device.h"

namespace {

namespace zt = zero::test_device;

class TestDevice : public ::testing::Test {
 protected:
  // Before this binary's first backward pass: the autograd engine counts
  // devices once.
  void SetUp() override {
    zt::install();
    zt::reset_transfer_counts();
  }
  static c10::Device dev(int index) { return zt::device(index); }
  static torch::TensorOptions on(int index, at::ScalarType dtype = at::kFloat) {
    return torch::TensorOptions().dtype(dtype).device(dev(index));
  }
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

void expect_mentions(const std::string& message, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' in: " << message;
}

// ---- registration -------------------------------------------------------------

TEST_F(TestDevice, IsThePrivateUse1AcceleratorNamedZdev) {
  EXPECT_EQ(c10::get_privateuse1_backend(), "zdev");
  EXPECT_EQ(dev(1).str(), "zdev:1");
  EXPECT_EQ(c10::Device("zdev:1"), dev(1));
  // Registered PrivateUse1 comes first, even beside CUDA: device-generic
  // at::accelerator calls reach zdev.
  EXPECT_EQ(at::accelerator::getAccelerator(), c10::DeviceType::PrivateUse1);
  EXPECT_EQ(at::accelerator::deviceCount(), 2);
  EXPECT_EQ(at::accelerator::getDeviceIndex(), 0);
  at::accelerator::setDeviceIndex(1);
  EXPECT_EQ(at::accelerator::getDeviceIndex(), 1);
  at::accelerator::setDeviceIndex(0);

  zt::install();  // again: nothing happens
  EXPECT_THROW(zt::install(3), c10::Error);
  EXPECT_THROW(zt::device(2), c10::Error);
}

// ---- it computes what the CPU computes ---------------------------------------

// A stock-module language model, with the ops a transformer step uses.
struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl(int64_t vocab, int64_t dim)
      : embed(register_module("embed", torch::nn::Embedding(vocab, dim))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        up(register_module("up", torch::nn::Linear(dim, 4 * dim))),
        down(register_module("down", torch::nn::Linear(4 * dim, dim))),
        head(register_module("head", torch::nn::Linear(dim, vocab))) {}

  torch::Tensor forward(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    torch::Tensor x = embed(tokens);
    torch::Tensor h = norm(x);
    torch::Tensor scores = torch::matmul(h, h.transpose(1, 2)) / std::sqrt(static_cast<double>(h.size(-1)));
    // The mask made on the tokens' device (the bundled GPT makes it on the CPU).
    const torch::Tensor future =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    x = x + torch::matmul(torch::softmax(scores, -1), h);
    x = x + down(torch::gelu(up(norm(x))));
    return head(x);
  }

  torch::nn::Embedding embed;
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down, head;
};
TORCH_MODULE(TinyLm);

struct TrainingRun {
  std::vector<float> losses;
  std::vector<torch::Tensor> params;  // on the CPU
};

TrainingRun train(c10::Device device, at::ScalarType dtype) {
  constexpr int64_t kVocab = 32, kDim = 16;
  at::manual_seed(0);  // the CPU's generator and every accelerator device's
  TinyLm model(kVocab, kDim);
  model->to(dtype);
  model->to(device);  // from the CPU, so every run starts from the same weights
  const torch::Tensor tokens = torch::randint(0, kVocab, {4, 9}).to(device);
  const torch::Tensor input = tokens.narrow(1, 0, 8), target = tokens.narrow(1, 1, 8);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).eps(1e-4).weight_decay(0.1));
  TrainingRun run;
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    const torch::Tensor logits = model->forward(input);
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), target.reshape({-1}));
    // view/select/cat/stack/mean/norm/mse on the way to the loss as well
    const torch::Tensor ends = torch::cat({logits.select(1, 0), logits.select(1, 7)}, 0);
    const torch::Tensor summary = torch::stack({ends.mean(), logits.norm() / 100});
    loss = loss + torch::mse_loss(summary, torch::zeros_like(summary));
    loss.backward();
    optimizer.step();
    run.losses.push_back(loss.item<float>());
  }
  for (const torch::Tensor& p : model->parameters()) run.params.push_back(p.detach().to(torch::kCPU));
  return run;
}

class TrainsLikeTheCpu : public TestDevice, public ::testing::WithParamInterface<std::tuple<int, at::ScalarType>> {};

TEST_P(TrainsLikeTheCpu, BitForBit) {
  const auto [index, dtype] = GetParam();
  const TrainingRun cpu = train(torch::kCPU, dtype);
  const TrainingRun device = train(dev(index), dtype);
  EXPECT_EQ(device.losses, cpu.losses);
  ASSERT_EQ(device.params.size(), cpu.params.size());
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    EXPECT_EQ(device.params[i].scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(device.params[i], cpu.params[i])) << "param " << i;
  }
  EXPECT_GT(cpu.losses.front(), cpu.losses.back()) << "it learns";
}

INSTANTIATE_TEST_SUITE_P(Zdev, TrainsLikeTheCpu,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf)));

// ---- it refuses what CUDA refuses ----------------------------------------------

TEST_F(TestDevice, AnOpMixingDevicesNamesTheOpAndBothDevices) {
  const torch::Tensor x = torch::zeros({4, 4}, on(0));
  const torch::Tensor future = torch::ones({4, 4}, torch::kBool).triu(1);  // on the CPU
  expect_mentions(error_of([&] { x.masked_fill(future, 1.0); }),
                  {"Expected all tensors to be on the same device", "zdev:0", "cpu", "masked_fill", "mask"});
  // (TensorIterator's own check, before the fallback's)
  expect_mentions(error_of([&] { x + torch::zeros({4, 4}, on(1)); }), {"zdev:0", "zdev:1"});
  expect_mentions(error_of([&] { torch::matmul(x, torch::eye(4)); }), {"zdev:0", "cpu"});

  // A 0-dim CPU tensor is a scalar, as CUDA takes it.
  const torch::Tensor filled = x.masked_fill(future.to(dev(0)), torch::scalar_tensor(2.0));
  EXPECT_EQ(filled.sum().item<float>(), 12.0f);
  EXPECT_EQ((x + torch::scalar_tensor(1.0)).sum().item<float>(), 16.0f);
  // CPU indices index a device tensor, as on CUDA.
  EXPECT_EQ(filled.index({torch::tensor({0, 1}), torch::tensor({3, 3})}).sum().item<float>(), 4.0f);
}

// What memory/storage_release.cpp does to a flat buffer: release gives its
// block back; restore takes a new one from the storage's allocator -- on the
// current device, which must be the buffer's.
void release(const torch::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));
  s->set_nbytes(0);
}
void restore(const torch::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

TEST_F(TestDevice, MemoryTakenOnTheWrongCurrentDeviceIsCaughtAtItsNextUse) {
  const torch::Tensor flat = torch::zeros({8}, on(1));
  // Views made before the release, as params are.
  const torch::Tensor param = flat.narrow(0, 2, 4), first = flat.narrow(0, 0, 1);
  release(flat);
  expect_mentions(error_of([&] { param.add_(1); }), {"add", "released"});

  ASSERT_EQ(at::accelerator::getDeviceIndex(), 0);
  restore(flat);  // no guard: the block comes from zdev:0
  EXPECT_EQ(flat.storage().device(), dev(0));
  expect_mentions(error_of([&] { flat.zero_(); }), {"zero_", "on zdev:1", "allocated on zdev:0"});
  expect_mentions(error_of([&] { param * 2; }), {"mul", "on zdev:1", "allocated on zdev:0"});
  expect_mentions(error_of([&] { first.item(); }), {"_local_scalar_dense", "on zdev:1", "allocated on zdev:0"});

  release(flat);
  {
    const c10::DeviceGuard guard(flat.device());
    restore(flat);
  }
  EXPECT_EQ(flat.storage().device(), dev(1));
  flat.zero_();
  param.fill_(5);
  EXPECT_TRUE(torch::equal(flat.cpu(), torch::tensor({0, 0, 5, 5, 5, 5, 0, 0}, torch::kFloat)));
}

TEST_F(TestDevice, ResultsAndGrownTensorsTakeMemoryOnTheirOwnDevice) {
  ASSERT_EQ(at::accelerator::getDeviceIndex(), 0);
  const torch::Tensor x = torch::ones({3, 3}, on(1));
  EXPECT_EQ(x.storage().device(), dev(1));
  EXPECT_EQ((x + 1).storage().device(), dev(1));
  EXPECT_EQ(x.sum().storage().device(), dev(1));
  torch::Tensor grown = torch::empty({0}, on(1));
  grown.resize_({1000});
  EXPECT_EQ(grown.storage().device(), dev(1));
  // A factory without an index: the current device, as on CUDA.
  const c10::DeviceGuard guard(dev(1));
  EXPECT_EQ(torch::empty({2}, torch::TensorOptions().device(c10::Device("zdev"))).device(), dev(1));
}

// ---- views, in-place ops, out= ops and storage surgery --------------------------

TEST_F(TestDevice, ViewsAliasTheirBaseAndInPlaceOpsKeepTheirStorage) {
  auto scribble = [](const torch::Tensor& base) {
    base.select(0, 1).fill_(1);
    base.transpose(0, 1).narrow(0, 3, 1).fill_(2);
    base.view({16}).narrow(0, 0, 1).fill_(3);
    base.unfold(1, 2, 2).select(2, 1).add_(10);
    base.diagonal().mul_(-1);
    base.add_(1).mul_(2);
  };
  const torch::Tensor base = torch::zeros({4, 4}, on(1));
  const torch::Tensor expected = torch::zeros({4, 4});
  const void* data = base.const_data_ptr();
  const c10::StorageImpl* storage = base.storage().unsafeGetStorageImpl();
  scribble(base);
  scribble(expected);
  EXPECT_TRUE(torch::equal(base.cpu(), expected));
  EXPECT_EQ(base.const_data_ptr(), data);
  EXPECT_EQ(base.storage().unsafeGetStorageImpl(), storage);

  // out=: into the tensor given, and into one the kernel must grow
  const torch::Tensor out = torch::empty({4, 4}, on(1));
  const void* out_data = out.const_data_ptr();
  torch::add_out(const_cast<torch::Tensor&>(out), base, base);
  EXPECT_EQ(out.const_data_ptr(), out_data);
  torch::Tensor grown = torch::empty({0}, on(1));
  torch::add_out(grown, base, base);
  EXPECT_EQ(grown.sizes(), base.sizes());
  EXPECT_EQ(grown.storage().device(), dev(1));
  EXPECT_TRUE(torch::equal(grown.cpu(), out.cpu()));
  EXPECT_TRUE(torch::equal(torch::arange(5, on(1)).cpu(), torch::arange(5, torch::kFloat)));

  // set_ onto another tensor's storage, and onto none
  torch::Tensor row = torch::empty({0}, on(1));
  row.set_(base.storage(), /*storage_offset=*/4, /*size=*/{4}, /*stride=*/{1});
  EXPECT_TRUE(torch::equal(row.cpu(), expected[1]));
  EXPECT_TRUE(row.is_set_to(base.select(0, 1)));
  row.set_();
  EXPECT_EQ(row.numel(), 0);
  EXPECT_EQ(row.device(), dev(1));
  EXPECT_EQ(row.storage().device(), dev(1));

  // set_data, as Module::to does
  torch::Tensor p = torch::zeros({3}, on(0)).requires_grad_();
  p.set_data(torch::ones({3}, on(1)));
  EXPECT_EQ(p.device(), dev(1));
  EXPECT_EQ(p.sum().item<float>(), 3.0f);
}

// ---- host syncs ---------------------------------------------------------------

TEST_F(TestDevice, CountsTransfersAndTheOnesTheHostWaitsFor) {
  const torch::Tensor x = torch::arange(6, on(0));
  zt::reset_transfer_counts();
  EXPECT_EQ(x.sum().item<float>(), 15.0f);
  const torch::Tensor host = x.to(torch::kCPU);
  EXPECT_EQ(x[2].item<float>(), 2.0f);
  auto c = zt::transfer_counts();
  EXPECT_EQ(c.device_to_host, 3);
  EXPECT_EQ(c.host_waits, 3);
  EXPECT_EQ(c.host_to_device, 0);

  std::ignore = host.to(dev(1));
  std::ignore = x.to(dev(1));
  // On the device: no transfer.
  std::ignore = x.clone();
  EXPECT_EQ(x.to(at::kHalf).device(), dev(0));
  c = zt::transfer_counts();
  EXPECT_EQ(c.host_to_device, 1);
  EXPECT_EQ(c.device_to_device, 1);
  EXPECT_EQ(c.device_to_host, 3);

  // Into pinned memory without blocking: a transfer the host does not wait for.
  torch::Tensor pinned = torch::empty({6}, torch::TensorOptions().pinned_memory(true));
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(host.is_pinned());
  pinned.copy_(x, /*non_blocking=*/true);
  c = zt::transfer_counts();
  EXPECT_EQ(c.device_to_host, 4);
  EXPECT_EQ(c.host_waits, 3);

  // A result whose size depends on device data.
  EXPECT_EQ(x.index({x > 2}).numel(), 3);
  EXPECT_EQ(zt::transfer_counts().host_waits, 4);
}

// ---- memory ---------------------------------------------------------------------

TEST_F(TestDevice, KeepsPerDeviceStatsAndFailsBeyondItsCapacity) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  auto allocated = [] { return at::accelerator::getDeviceStats(1).allocated_bytes[0]; };
  const int64_t before = allocated().current;
  const int64_t before_on_0 = at::accelerator::getDeviceStats(0).allocated_bytes[0].current;
  at::accelerator::resetPeakStats(1);
  {
    const torch::Tensor a = torch::empty({kMiB}, on(1, at::kByte));
    const torch::Tensor b = torch::empty({3 * kMiB}, on(1, at::kByte));
    EXPECT_EQ(allocated().current, before + 4 * kMiB);
  }
  const torch::Tensor c = torch::empty({kMiB / 2}, on(1, at::kByte));
  EXPECT_EQ(allocated().current, before + kMiB / 2);
  EXPECT_EQ(allocated().peak, before + 4 * kMiB);
  EXPECT_EQ(at::accelerator::getDeviceStats(0).allocated_bytes[0].current, before_on_0);

  EXPECT_EQ(zt::capacity(1), zt::kDefaultCapacity);
  zt::set_capacity(1, static_cast<size_t>(before + 8 * kMiB));
  const auto [free, total] = at::accelerator::getMemoryInfo(1);
  EXPECT_EQ(total, static_cast<size_t>(before + 8 * kMiB));
  EXPECT_EQ(free, static_cast<size_t>(8 * kMiB - kMiB / 2));
  EXPECT_THROW(torch::empty({8 * kMiB}, on(1, at::kByte)), c10::OutOfMemoryError);
  EXPECT_NO_THROW(torch::empty({8 * kMiB - kMiB / 2}, on(1, at::kByte)));
  EXPECT_NO_THROW(torch::empty({8 * kMiB}, on(0, at::kByte)));  // another device's capacity
  zt::set_capacity(1, zt::kDefaultCapacity);
}

// ---- threads, streams and events ----------------------------------------------------

TEST_F(TestDevice, BackwardOnDevice1RunsOnAThreadWhoseCurrentDeviceIs1) {
  const torch::Tensor w = torch::ones({4}, on(1)).requires_grad_();
  c10::DeviceIndex hook_device = -1;
  std::thread::id hook_thread;
  w.register_hook([&](const torch::Tensor&) {
    hook_device = at::accelerator::getDeviceIndex();
    hook_thread = std::this_thread::get_id();
  });
  (w * w).sum().backward();
  EXPECT_EQ(hook_device, 1);
  EXPECT_NE(hook_thread, std::this_thread::get_id());
  EXPECT_EQ(at::accelerator::getDeviceIndex(), 0);
  EXPECT_EQ(w.grad().storage().device(), dev(1));
  EXPECT_TRUE(torch::equal(w.grad().cpu(), torch::full({4}, 2.0f)));
}

TEST_F(TestDevice, StreamsAndEventsBehaveAsIfEveryKernelHadFinished) {
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::PrivateUse1);
  const c10::Stream side = impl.getNewStream(dev(1));
  const c10::Stream main = at::accelerator::getCurrentStream(1);
  EXPECT_EQ(main, impl.getDefaultStream(dev(1)));
  EXPECT_NE(side, main);
  {
    const c10::StreamGuard guard(side);
    EXPECT_EQ(at::accelerator::getCurrentStream(1), side);
    EXPECT_EQ(at::accelerator::getDeviceIndex(), 1);
  }
  EXPECT_EQ(at::accelerator::getCurrentStream(1), main);
  EXPECT_EQ(at::accelerator::getDeviceIndex(), 0);

  c10::Event start(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  c10::Event done(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  start.record(side);
  std::ignore = torch::ones({8}, on(1)) * 2;
  done.record(side);
  done.block(main);
  EXPECT_TRUE(done.query());
  done.synchronize();
  EXPECT_GE(start.elapsedTime(done), 0.0);
  EXPECT_TRUE(side.query());
  side.synchronize();
  at::accelerator::synchronizeDevice(1);
}

}  // namespace

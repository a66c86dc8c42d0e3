// The smallest complete zero-cpp program: a custom torch::nn::Module whose
// blocks are zero::Unit (so stage 3 gathers them one at a time), a
// ds_config, and the engine's backward/step loop. It learns a fixed random
// teacher network from random inputs.
//
//   zero-run -n 2 -- ./minimal ds_config.json
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <zero/engine.h>
#include <zero/init.h>
#include <zero/unit.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(width, width)); }
  at::Tensor forward(const at::Tensor& x) { return x + at::tanh(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

struct Net : torch::nn::Module {
  Net(int64_t width, int depth) {
    for (int i = 0; i < depth; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), zero::Unit<Block>(width)));
    head = register_module("head", torch::nn::Linear(width, 1));  // outside every unit: the root
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& b : blocks) x = b->forward(x);
    return head->forward(x);
  }
  std::vector<zero::Unit<Block>> blocks;
  torch::nn::Linear head{nullptr};
};

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: zero-run -n 2 -- minimal ds_config.json\n");
    return 2;
  }
  auto world = zero::init_distributed();
  auto config = zero::Config::from_file(argv[1]);
  const int64_t width = 64;

  at::manual_seed(0);  // the same weights on every rank (the engine also broadcasts rank 0's)
  Net teacher(width, 2);
  std::shared_ptr<Net> model;
  {
    zero::Init init(*world, config);  // stage 3: each unit is sharded as soon as it is built
    model = std::make_shared<Net>(width, 4);
  }
  zero::Engine engine(*model, config, *world);
  if (world->rank() == 0) std::printf("%s\n", engine.describe().c_str());

  const int64_t micro = engine.batch().micro_batch_per_gpu;
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    at::manual_seed(1000 + step * world->size() + world->rank());  // this rank's part of the global batch
    auto x = at::randn({micro, width});
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = teacher.forward(x);
    }
    // engine.forward(): at stage 3 the params outside every unit (the head)
    // are gathered for it and sharded again after the step.
    auto loss = engine.forward([&] { return (model->forward(x) - y).pow(2).mean(); });
    engine.backward(loss);
    engine.step();
    const double l = loss.item<double>();
    if (step == 0) first = l;
    last = l;
    if (world->rank() == 0 && step % 20 == 0) std::printf("step %2d  loss %.4f\n", step, l);
  }
  if (world->rank() == 0) std::printf("loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}

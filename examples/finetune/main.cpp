// Fine-tuning with zero-cpp, from training to inference: a pretrained
// backbone kept frozen, an adapter and a head trained in two param groups
// (each its own lr), checkpoints saved every few steps and resumed, and the
// consolidated weights (zero-ckpt consolidate) read back into the plain
// model for inference with zero::load_weights -- no engine, no ranks.
//
//   zero-run -n 2 -- ./finetune train ds_config.json CKPT --steps 10     # steps 1-10
//   zero-run -n 2 -- ./finetune train ds_config.json CKPT --steps 20     # resumes at 10
//   zero-ckpt consolidate CKPT model.safetensors
//   ./finetune infer model.safetensors                                # one process
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <zero/comm.h>
#include <zero/config.h>
#include <zero/engine.h>
#include <zero/weights.h>

constexpr int64_t kIn = 32, kHidden = 64;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    backbone = register_module("backbone", torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::GELU(),
                                                                 torch::nn::Linear(kHidden, kHidden)));
    adapter = register_module("adapter", torch::nn::Linear(kHidden, kHidden));
    head = register_module("head", torch::nn::Linear(kHidden, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = backbone->forward(x);
    h = h + torch::gelu(adapter->forward(h));  // a residual adapter on the frozen features
    return head->forward(h);
  }
  torch::nn::Sequential backbone{nullptr};
  torch::nn::Linear adapter{nullptr}, head{nullptr};
};
TORCH_MODULE(Net);

// The task: a fixed function of the input, the same on every run.
torch::Tensor target(const torch::Tensor& x) { return torch::sin(x.narrow(1, 0, 4).sum(1, true)) + 0.1 * x.narrow(1, 4, 1); }

torch::Tensor batch(int64_t seed, int64_t rows) {
  torch::manual_seed(seed);
  return torch::randn({rows, kIn});
}

// The held-out loss both modes print: training's final one must equal
// inference's after the weights' round trip through the checkpoint.
double eval_loss(const std::function<torch::Tensor(const torch::Tensor&)>& f) {
  torch::NoGradGuard no_grad;
  const auto x = batch(999, 256);
  return (f(x) - target(x)).pow(2).mean().item<double>();
}

int train(const std::string& config_path, const std::string& ckpt, int64_t steps) {
  auto world = zero::init_distributed();
  auto config = zero::Config::from_file(config_path);
  torch::manual_seed(0);  // the "pretrained" weights (rank 0's are broadcast)
  Net model;
  // Frozen: no grads, no optimizer state, kept whole on every rank (and saved).
  for (auto& p : model->backbone->parameters()) p.requires_grad_(false);
  // Two param groups: the new head learns fast, the adapter slower and
  // without weight decay on its bias.
  std::vector<zero::ParamGroup> groups = {
      {{model->head->weight, model->head->bias}, 3e-3, 0.01},
      {{model->adapter->weight}, 1e-3, 0.01},
      {{model->adapter->bias}, 1e-3, 0.0},
  };
  zero::Engine engine(*model, config, *world, groups);
  const bool lead = world->rank() == 0;

  int64_t done = 0;
  if (std::filesystem::exists(ckpt + "/latest")) {
    done = engine.load_checkpoint(ckpt).value("step", int64_t{0});  // weights, optimizer, schedule, counters
    if (lead) std::printf("resumed from %s at step %lld\n", ckpt.c_str(), static_cast<long long>(done));
  }
  const int64_t micro = engine.batch().micro_batch_per_gpu;
  for (int64_t step = done + 1; step <= steps; ++step) {
    const auto x = batch(step * world->size() + world->rank(), micro);  // the data follows the step: resumable
    auto loss = engine.forward([&] { return (model->forward(x) - target(x)).pow(2).mean(); });
    engine.backward(loss);
    engine.step();
    const double mean = engine.global_mean(loss);
    if (lead && (step % 5 == 0 || step == done + 1)) std::printf("step %lld loss %.4f\n", static_cast<long long>(step), mean);
    if (step % 5 == 0 || step == steps)
      engine.save_checkpoint(ckpt, "step" + std::to_string(step), {{"step", step}});
  }
  const double held_out = eval_loss([&](const torch::Tensor& x) { return engine.forward(model, x); });
  if (lead) std::printf("held-out loss %.6f after %lld steps\n", held_out, static_cast<long long>(steps));
  world->shutdown();
  return 0;
}

int infer(const std::string& weights) {
  Net model;                              // the same architecture, plain libtorch
  zero::load_weights(*model, weights);    // every param and buffer by name, shapes checked
  model->eval();
  std::printf("inference: held-out loss %.6f\n", eval_loss([&](const torch::Tensor& x) { return model->forward(x); }));
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "train" && (argc == 4 || argc == 6))
      return train(argv[2], argv[3], argc == 6 ? std::atoll(argv[5]) : 20);
    if (mode == "infer" && argc == 3) return infer(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finetune: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: finetune train ds_config.json CKPT_DIR [--steps N] | finetune infer WEIGHTS.safetensors\n");
  return 2;
}

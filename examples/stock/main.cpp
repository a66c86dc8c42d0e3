#include <cstdint>
#include <cstdio>

#include <torch/torch.h>
#include <zero/comm.h>
#include <zero/config.h>
#include <zero/engine.h>

int main(int argc, char** argv) {
  auto world = zero::init_distributed();                  // from the launcher's env
  // Stage and precision (fp32, bf16, fp16) come from the config alone.
  auto config = zero::Config::from_file(argc > 1 ? argv[1] : "ds_config.json");
  torch::manual_seed(0);                                  // the engine also broadcasts rank 0's weights
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  const torch::Device device = world->device();          // this rank's GPU (LOCAL_RANK), else the CPU
  model->to(device);
  zero::Engine engine(*model, config, *world);            // flattens and shards per the stage
  const int64_t micro = engine.batch().micro_batch_per_gpu;
  for (int step = 0; step < 20; ++step) {
    torch::manual_seed(1 + step * world->size() + world->rank());  // this rank's micro-batch
    auto x = torch::randn({micro, 16}).to(device);
    auto y = x.sum(1, /*keepdim=*/true);                  // the function to learn
    auto out = engine.forward(model, x);                  // x cast to the params' compute dtype
    auto loss = (out.to(torch::kFloat) - y).pow(2).mean();
    engine.backward(loss);                                // x loss scale / gradient_accumulation_steps
    engine.step();                                        // updates only at the accumulation boundary
    if (world->rank() == 0) std::printf("step %d loss %.4f\n", step, loss.item<double>());
  }
  world->shutdown();                                      // communicators go while CUDA is up
}

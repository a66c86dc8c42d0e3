// ZeRO stage 3 on a model of your own: its blocks declared as zero::Unit (each
// gathered for its forward and backward, released after), the model built
// under zero::Init (no rank ever holds it whole), evaluation through
// engine.forward under NoGradGuard, a full weight read inside a
// gathered_parameters() scope, and the per-rank state against the whole
// model's. The weights it saves load into the plain model (zero::load_weights).
//
//   zero-run -n 2 -- ./stage3 ds_config.json [weights.safetensors]
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <zero/comm.h>
#include <zero/config.h>
#include <zero/engine.h>
#include <zero/init.h>
#include <zero/unit.h>
#include <zero/weights.h>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t d) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    up = register_module("up", torch::nn::Linear(d, 4 * d));
    down = register_module("down", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down->forward(torch::gelu(up->forward(norm->forward(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Block);

// Embedding -> units -> head: the embedding and the head (outside every
// unit) are the root unit, gathered around engine.forward(...).
struct ModelImpl : torch::nn::Module {
  ModelImpl(int64_t vocab, int64_t d, int layers) {
    embed = register_module("embed", torch::nn::Embedding(vocab, d));
    for (int i = 0; i < layers; ++i) blocks.push_back(register_module("h" + std::to_string(i), zero::Unit<Block>(d)));
    head = register_module("head", torch::nn::Linear(d, vocab));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = embed->forward(tokens);
    for (auto& b : blocks) x = b->forward(x);
    return head->forward(x);
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<zero::Unit<Block>> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Model);

constexpr int64_t kVocab = 64, kDim = 64, kSeq = 16;
constexpr int kLayers = 4;

// Next-token prediction on a fixed rule (each token is the previous one plus 3).
std::pair<torch::Tensor, torch::Tensor> batch(int64_t seed, int64_t rows) {
  torch::manual_seed(seed);
  auto start = torch::randint(kVocab, {rows, 1}, torch::kLong);
  auto seq = (start + 3 * torch::arange(kSeq + 1, torch::kLong)).remainder(kVocab);
  return {seq.narrow(1, 0, kSeq), seq.narrow(1, 1, kSeq)};
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}).to(torch::kFloat), y.reshape(-1));
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: zero-run -n 2 -- stage3 ds_config.json [weights.safetensors]\n");
    return 2;
  }
  auto world = zero::init_distributed();
  auto config = zero::Config::from_file(argv[1]);
  const bool lead = world->rank() == 0;
  Model model{nullptr};
  torch::manual_seed(0);  // zero::Init also syncs each unit from rank 0
  {
    zero::Init init(*world, config);  // each unit sharded as soon as it is built
    model = Model(kVocab, kDim, kLayers);
  }
  zero::Engine engine(*model, config, *world);
  if (lead) std::printf("%s\n", engine.describe().c_str());

  const int64_t micro = engine.batch().micro_batch_per_gpu;
  auto evaluate = [&] {
    torch::NoGradGuard no_grad;  // units are still gathered one at a time
    auto [x, y] = batch(999, 32);
    return engine.global_mean(loss_of(engine.forward(model, x), y));
  };
  const double before = evaluate();
  for (int step = 1; step <= 30; ++step) {
    auto [x, y] = batch(step * world->size() + world->rank(), micro);
    auto loss = engine.forward([&] { return loss_of(model->forward(x), y); });
    engine.backward(loss);
    engine.step();
    if (lead && step % 10 == 0) std::printf("step %d loss %.4f\n", step, loss.item<double>());
  }
  const double after = evaluate();
  {
    // A unit's params are shards outside its forward; here they are whole.
    const torch::Tensor w = model->blocks[0]->inner->up->weight;  // the unit's wrapped Block
    auto full = engine.gathered_parameters({w});
    if (lead) std::printf("h0.up.weight: %s, norm %.4f\n", c10::str(w.sizes()).c_str(), w.norm().item<double>());
  }
  const auto mine = engine.state_bytes();
  if (lead)
    std::printf("held-out loss %.4f -> %.6f; model state on this rank %.2f MB, peak live params %lld of %lld\n",
                before, after, mine.total() / 1048576.0, static_cast<long long>(engine.peak_live_params()),
                static_cast<long long>(engine.num_params()));
  if (argc > 2) {
    engine.save_weights(argv[2]);  // every rank calls; rank 0 writes the full weights
    if (lead) {
      Model plain(kVocab, kDim, kLayers);  // no Init, no engine: whole on this rank
      zero::load_weights(*plain, argv[2]);
      torch::NoGradGuard no_grad;
      auto [x, y] = batch(999, 32);
      std::printf("plain model from %s: held-out loss %.6f\n", argv[2], loss_of(plain->forward(x), y).item<double>());
    }
  }
  world->shutdown();
  return after < before ? 0 : 1;
}

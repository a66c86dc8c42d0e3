#include "models/gpt.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <ATen/core/grad_mode.h>

#include "zero/activation_checkpoint.h"
#include "zero/init.h"

namespace zero::models {

namespace {

// GPT-2's init: N(0, std) weights, zero biases (LayerNorm keeps its ones/zeros).
void init_linear(torch::nn::Linear& l, double std) {
  at::NoGradGuard no_grad;
  l->weight.normal_(0.0, std);
  if (l->bias.defined()) l->bias.zero_();
}

// A stock torch::nn::Linear whose params are allocated but not yet drawn:
// its constructor's own init (kaiming_uniform_ over every weight, a
// sequential pass of the CPU generator) would be overwritten by
// init_linear at once (issue 36 item 4: building the 607M GPT under
// zero::Init went from ~10.6 to ~8.8 s on a 2-core VM). Built empty, then
// its params grown in place: the same module, names and parameter objects.
// The weights' distribution is unchanged; their values are not (the
// generator no longer draws the uniform pass first).
torch::nn::Linear uninitialised_linear(torch::nn::LinearOptions options) {
  // (1 input, 0 outputs: nothing to draw, and a fan-in its init can divide by)
  torch::nn::Linear l(torch::nn::LinearOptions(1, 0).bias(options.bias()));
  l->options = options;
  l->weight.set_data(at::empty({options.out_features(), options.in_features()}));
  if (options.bias()) l->bias.set_data(at::empty({options.out_features()}));
  return l;
}

}  // namespace

int64_t GPTConfig::num_params() const {
  const int64_t d = d_model;
  const int64_t block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return vocab * d + seq_len * d + n_layer * block + 2 * d + (tied_head ? 0 : vocab * d);
}

std::string GPTConfig::describe() const {
  std::ostringstream os;
  os << "GPT " << n_layer << " layers, d_model " << d_model << ", " << n_head << " heads, seq " << seq_len
     << ", vocab " << vocab << (tied_head ? ", tied head" : ", untied head") << " (" << num_params() << " params)";
  return os.str();
}

BlockImpl::BlockImpl(const GPTConfig& c) : n_head_(c.n_head) {
  const int64_t d = c.d_model;
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);  // GPT-2's scaled residual init
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  attn_qkv = register_module("attn_qkv", uninitialised_linear({d, 3 * d}));
  attn_proj = register_module("attn_proj", uninitialised_linear({d, d}));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  mlp_fc = register_module("mlp_fc", uninitialised_linear({d, 4 * d}));
  mlp_proj = register_module("mlp_proj", uninitialised_linear({4 * d, d}));
  // Under zero::Init on a device these draws run there, into the unit's
  // flat buffer (zero::defer_init); elsewhere at once, as written.
  zero::defer_init(*this, [this, std, proj_std] {
    ln1->reset_parameters();
    ln2->reset_parameters();
    init_linear(attn_qkv, std);
    init_linear(attn_proj, proj_std);
    init_linear(mlp_fc, std);
    init_linear(mlp_proj, proj_std);
  });
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head_;
  // Causal self-attention.
  auto qkv = attn_qkv(ln1(x)).view({B, T, 3, n_head_, hd});
  auto q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2), v = qkv.select(2, 2).transpose(1, 2);
  // Fused attention (flash / memory-efficient kernels on CUDA, a blocked
  // kernel on the CPU): the T x T scores are never materialised.
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true)
               .transpose(1, 2)
               .reshape({B, T, C});
  auto h = x + attn_proj(y);
  // MLP.
  return h + mlp_proj(at::gelu(mlp_fc(ln2(h))));
}

GPTImpl::GPTImpl(const GPTConfig& c) : cfg_(c) {
  if (c.d_model % c.n_head) throw std::invalid_argument("GPT: d_model must be divisible by n_head");
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(c.seq_len, c.d_model));
  {
    at::NoGradGuard no_grad;
    wte->weight.normal_(0.0, 0.02);
    wpe->weight.normal_(0.0, 0.01);
  }
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.push_back(register_module("h" + std::to_string(i), zero::Unit<Block>(c)));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  if (!c.tied_head) {
    head = register_module("head", uninitialised_linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
    init_linear(head, 0.02);
  }
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > cfg_.seq_len) throw std::invalid_argument("GPT: sequence longer than seq_len");
  auto x = wte(tokens) + wpe->weight.narrow(0, 0, T);
  for (auto& b : blocks_)
    x = cfg_.checkpoint_activations ? checkpoint_activations([&b](const at::Tensor& h) { return b->forward(h); }, x)
                                    : b->forward(x);
  x = ln_f(x);
  return cfg_.tied_head ? at::linear(x, wte->weight) : head(x);
}

at::Tensor GPTImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  auto logits = forward(tokens);
  return at::cross_entropy_loss(logits.view({-1, logits.size(-1)}).to(at::kFloat), targets.reshape(-1));
}

}  // namespace zero::models

#include "models/gpt.h"

#include <cmath>
#include <sstream>

#include <ATen/core/grad_mode.h>

#include "zero/engine.h"

namespace zero::models {

namespace {

at::Tensor normal(std::initializer_list<int64_t> shape, double std) {
  return at::normal(0.0, std, shape, c10::nullopt, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::layer_norm(x, {x.size(-1)}, compute(w), compute(b), 1e-5);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::linear(x, compute(w), b.defined() ? c10::optional<at::Tensor>(compute(b)) : c10::nullopt);
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
  ln1_w_ = register_parameter("ln1_weight", at::ones({d}));
  ln1_b_ = register_parameter("ln1_bias", at::zeros({d}));
  qkv_w_ = register_parameter("attn_qkv_weight", normal({3 * d, d}, std));
  qkv_b_ = register_parameter("attn_qkv_bias", at::zeros({3 * d}));
  proj_w_ = register_parameter("attn_proj_weight", normal({d, d}, proj_std));
  proj_b_ = register_parameter("attn_proj_bias", at::zeros({d}));
  ln2_w_ = register_parameter("ln2_weight", at::ones({d}));
  ln2_b_ = register_parameter("ln2_bias", at::zeros({d}));
  fc_w_ = register_parameter("mlp_fc_weight", normal({4 * d, d}, std));
  fc_b_ = register_parameter("mlp_fc_bias", at::zeros({4 * d}));
  fc_proj_w_ = register_parameter("mlp_proj_weight", normal({d, 4 * d}, proj_std));
  fc_proj_b_ = register_parameter("mlp_proj_bias", at::zeros({d}));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head_;
  // Causal self-attention.
  auto qkv = linear(layer_norm(x, ln1_w_, ln1_b_), qkv_w_, qkv_b_).view({B, T, 3, n_head_, hd});
  auto q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2), v = qkv.select(2, 2).transpose(1, 2);
  auto att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  auto mask = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
  att = at::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  auto y = at::matmul(att, v).transpose(1, 2).reshape({B, T, C});
  auto h = x + linear(y, proj_w_, proj_b_);
  // MLP.
  auto m = at::gelu(linear(layer_norm(h, ln2_w_, ln2_b_), fc_w_, fc_b_));
  return h + linear(m, fc_proj_w_, fc_proj_b_);
}

GPTImpl::GPTImpl(const GPTConfig& c) : cfg_(c) {
  if (c.d_model % c.n_head) throw std::invalid_argument("GPT: d_model must be divisible by n_head");
  wte_ = register_parameter("wte", normal({c.vocab, c.d_model}, 0.02));
  wpe_ = register_parameter("wpe", normal({c.seq_len, c.d_model}, 0.01));
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.push_back(register_module("h" + std::to_string(i), zero::Unit<Block>(c)));
  lnf_w_ = register_parameter("ln_f_weight", at::ones({c.d_model}));
  lnf_b_ = register_parameter("ln_f_bias", at::zeros({c.d_model}));
  if (!c.tied_head) head_w_ = register_parameter("head_weight", normal({c.vocab, c.d_model}, 0.02));
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > cfg_.seq_len) throw std::invalid_argument("GPT: sequence longer than seq_len");
  auto x = at::embedding(compute(wte_), tokens) + compute(wpe_).narrow(0, 0, T);
  for (auto& b : blocks_) x = b->forward(x);
  x = layer_norm(x, lnf_w_, lnf_b_);
  return at::linear(x, compute(cfg_.tied_head ? wte_ : head_w_));
}

at::Tensor GPTImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  auto logits = forward(tokens);
  return at::cross_entropy_loss(logits.view({-1, logits.size(-1)}), targets.reshape(-1));
}

}  // namespace zero::models

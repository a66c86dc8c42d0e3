// The bundled GPT: a pre-LN decoder (token + position embeddings, causal
// self-attention, GELU MLP, tied or untied head) over byte tokens, so no
// tokenizer is needed. Each block is a zero::Unit (stage 3's gather unit;
// the names stay the plain model's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "zero/unit.h"

namespace zero::models {

struct GPTConfig {
  int64_t vocab = 256;
  int64_t seq_len = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 256;
  bool tied_head = true;
  // Each block's activations recomputed in backward (zero/activation_checkpoint.h).
  bool checkpoint_activations = false;

  int64_t num_params() const;  // exact count for this shape
  std::string describe() const;
};

// Stock torch::nn layers only (no zero::compute(), no hand-made params), so
// its param names are the ones a plain libtorch or PyTorch GPT would have
// ("h0.attn_qkv.weight") and it trains at any precision unchanged.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t n_head_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear attn_qkv{nullptr}, attn_proj{nullptr}, mlp_fc{nullptr}, mlp_proj{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& c);
  // tokens [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& tokens);
  // Mean next-token cross entropy (in fp32 whatever the compute dtype).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  const GPTConfig& config() const { return cfg_; }

 private:
  GPTConfig cfg_;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};  // untied head only; tied: wte's weight
  std::vector<zero::Unit<Block>> blocks_;  // stage 3 gathers and releases each block as a unit
};
TORCH_MODULE(GPT);

}  // namespace zero::models

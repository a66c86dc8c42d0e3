// The bundled GPT: a pre-LN decoder (token + position embeddings, causal
// self-attention, GELU MLP, tied or untied head) over byte tokens, so no
// tokenizer is needed. Each block is a zero::Unit. Params are used through zero::compute(), so the model
// trains with 16-bit storage and fp32 compute under bf16/fp16 configs.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
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

  int64_t num_params() const;  // exact count for this shape
  std::string describe() const;
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t n_head_;
  at::Tensor ln1_w_, ln1_b_, qkv_w_, qkv_b_, proj_w_, proj_b_;
  at::Tensor ln2_w_, ln2_b_, fc_w_, fc_b_, fc_proj_w_, fc_proj_b_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& c);
  // tokens [B, T] int64 -> logits [B, T, vocab]
  at::Tensor forward(const at::Tensor& tokens);
  // Mean next-token cross entropy.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  const GPTConfig& config() const { return cfg_; }

 private:
  GPTConfig cfg_;
  at::Tensor wte_, wpe_, lnf_w_, lnf_b_, head_w_;
  std::vector<zero::Unit<Block>> blocks_;  // stage 3 gathers and releases each block as a unit
};
TORCH_MODULE(GPT);

}  // namespace zero::models

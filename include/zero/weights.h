/// @file
/// zero::load_weights: read a consolidated safetensors file (zero-ckpt
/// consolidate's output, or Engine::save_weights') into a plain libtorch
/// module, with no engine and no ranks -- from training to inference.
///
///   MyModel model;                       // the same architecture, built normally
///   zero::load_weights(*model, "model.safetensors");
///   torch::NoGradGuard no_grad;
///   auto logits = model->forward(tokens);
#pragma once

#include <string>

#include <torch/nn/module.h>

namespace zero {

/// Copies every tensor of the safetensors file at `safetensors_path` into the
/// param or buffer of `module` of the same name (named_parameters() and
/// named_buffers(), recursively), converting F32, BF16 or F16 to the
/// module's dtype and device. The file and the module must name the same
/// params: every param missing from the file, every tensor the module has no
/// param or buffer for and every shape that differs is named in one
/// std::runtime_error, and the module is left unchanged. A buffer absent from
/// the file keeps its value (files from older checkpoints may hold params
/// only). Params keep their requires_grad.
void load_weights(torch::nn::Module& module, const std::string& safetensors_path);

}  // namespace zero

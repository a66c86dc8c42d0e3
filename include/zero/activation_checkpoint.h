/// @file
/// Activation checkpointing for the C++ frontend (torch.utils.checkpoint's
/// reentrant variant, which libtorch lacks): `piece` runs without keeping its
/// activations, and runs again in backward with grad, where the params it
/// uses get their grads through a nested backward.
///
///   for (auto& block : blocks)
///     x = zero::checkpoint_activations([&](const at::Tensor& h) { return block->forward(h); }, x);
///
/// Works at every stage with stock modules and zero::Unit alike: a weight
/// used by several checkpointed pieces gets each grad (the engine counts
/// them), and at stage 3 a unit is gathered again for its recompute. The
/// piece must be deterministic (no dropout whose mask differs on recompute)
/// and take and return one tensor; it is kept until the backward has run.
#pragma once

#include <functional>

#include <ATen/ATen.h>

namespace zero {

/// Runs `piece(x)` without keeping its activations; backward runs it again with grad (see the file's description).
at::Tensor checkpoint_activations(std::function<at::Tensor(const at::Tensor&)> piece, const at::Tensor& x);

}  // namespace zero

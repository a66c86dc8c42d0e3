#include "zero/activation_checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace zero {

namespace {

using Piece = std::function<at::Tensor(const at::Tensor&)>;

// The piece travels in the autograd context inside a tensor whose deleter
// owns it (an IValue cannot hold a std::function), so it lives exactly as
// long as the graph node that may recompute it.
at::Tensor hold(Piece piece) {
  auto* owned = new Piece(std::move(piece));
  return at::from_blob(owned, {1}, [](void* p) { delete static_cast<Piece*>(p); }, at::TensorOptions().dtype(at::kByte));
}

const Piece& held(const at::Tensor& holder) { return *static_cast<const Piece*>(holder.data_ptr()); }

struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& holder) {
    ctx->save_for_backward({x});
    ctx->saved_data["piece"] = holder;
    return held(holder)(x);  // Function::apply runs this without recording a graph
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const at::Tensor holder = ctx->saved_data["piece"].toTensor();
    const at::Tensor saved = ctx->get_saved_variables()[0];
    at::Tensor x = saved.detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      y = held(holder)(x);
    }
    if (y.requires_grad()) torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint_activations(std::function<at::Tensor(const at::Tensor&)> piece, const at::Tensor& x) {
  // Evaluation has nothing to recompute; an input that needs no grad would
  // make the recomputed piece's output need none, losing its params' grads
  // (torch.utils.checkpoint's reentrant variant warns of the same), so such
  // a piece runs plainly.
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return piece(x);
  return Recompute::apply(x, hold(std::move(piece)));
}

}  // namespace zero

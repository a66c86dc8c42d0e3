#include "zero/activation_checkpoint.h"

#include <utility>
#include <vector>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "engine/nested_backward.h"

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
    detail::NestedBackwardScope nested;
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

namespace detail {
namespace {

// Per thread: autograd runs a reentrant backward on the thread of the node
// that started it.
thread_local int depth = 0;
thread_local std::vector<std::function<void()>> waiting;

void queue_on_running_task(std::function<void()> callback) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
}

}  // namespace

NestedBackwardScope::NestedBackwardScope() { ++depth; }

NestedBackwardScope::~NestedBackwardScope() {
  if (--depth > 0 || waiting.empty()) return;
  std::vector<std::function<void()>> ready;
  ready.swap(waiting);
  for (auto& callback : ready) {
    // The running task is the enclosing backward's. A destructor may not
    // throw: a callback that cannot be queued is dropped, as a failed
    // backward's would be (its owner notices by the token it held).
    try {
      queue_on_running_task(std::move(callback));
    } catch (...) {
    }
  }
}

void at_end_of_outermost_backward(std::function<void()> callback) {
  if (depth > 0) {
    waiting.push_back(std::move(callback));
    return;
  }
  queue_on_running_task(std::move(callback));
}

}  // namespace detail

}  // namespace zero

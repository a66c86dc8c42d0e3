// The backwards that zero::checkpoint_activations nests inside a plain
// loss.backward(): each recomputed piece runs a backward of its own (a new
// autograd graph task, reentrant, on the same thread), which ends long
// before the enclosing one does. The engine's work at the end of a plain
// backward (the grad reduction, stage 3's schedule) belongs at the end of
// the outermost one, but autograd only queues a callback on the graph task
// that is running, so a grad that first arrives inside a nested backward
// could only end it early: one full reduction per recomputed piece.
//
// NestedBackwardScope marks a recompute's nested backward; a callback asked
// for inside one waits in the scope and is queued when the outermost scope
// closes, on the graph task that ran the recompute node (the outermost).
// (Defined in activation_checkpoint.cpp, the one user of the scope.)
#pragma once

#include <functional>

namespace zero::detail {

class NestedBackwardScope {
 public:
  NestedBackwardScope();
  ~NestedBackwardScope();  // the outermost one queues what waited
  NestedBackwardScope(const NestedBackwardScope&) = delete;
  NestedBackwardScope& operator=(const NestedBackwardScope&) = delete;
};

// Runs `callback` when the outermost autograd backward on this thread ends
// (queued on the running graph task, or, inside a NestedBackwardScope, on
// the one that encloses the outermost scope). If that backward fails, the
// callback is destroyed unrun, as autograd does with its queued callbacks.
void at_end_of_outermost_backward(std::function<void()> callback);

}  // namespace zero::detail

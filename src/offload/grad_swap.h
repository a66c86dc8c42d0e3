// ZeRO-Infinity's grads on NVMe (with offload_optimizer.device "nvme" at
// stages 2 and 3 on a host model, as DeepSpeed swaps them there): each
// group's fp32 reduced-grad shard -- this rank's part of the grads the
// optimizer reads -- lives in a swap file from its reduction to the step,
// in memory only while a reduction writes it or the step reads it. Without
// this the shards (4 bytes a param of this rank's part) are the largest
// thing in memory at the end of backward.
//
// The grad reducer (zero/grad_reducer.cpp) holds a group's shard from the
// launch of its reduce-scatter to its finish, then hands it back with
// reduced(), which takes its norm (the step's clipping and overflow check
// need the global norm before any group's update, and the shard is not in
// memory then) and writes it out. The step reads each group's shard beside
// its optimizer state (FlatOptimizer::update). zero_grads() discards them
// all: an Empty slot reads as zeros, with no I/O.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "offload/state_swapper.h"

namespace zero::offload {

class GradSwap {
 public:
  // `options`: nvme_path, aio, pipelining and rank (the optimizer's); opens the file.
  explicit GradSwap(SwapperOptions options);

  // Takes group `group`'s grad shard (fp32, page-backed, host), zeros now,
  // to the swap file: its pages released, nothing written. Groups are
  // adopted in order (0, 1, ...).
  void adopt(size_t group, const at::Tensor& shard, const std::string& label);

  // A reduction is about to write the shard: in memory until reduced().
  // keep: it adds to what the shard holds (read it in); otherwise it is
  // overwritten whole (no read).
  void hold_for_reduction(size_t group, bool keep);
  void prefetch(size_t group);  // start reading it in (for a hold that keeps, or the step)
  // The reduction into the held shard is done: its norm is taken, it is
  // written out and its pages released.
  void reduced(size_t group, const at::Tensor& shard);
  // The step's read: in memory until release().
  void acquire(size_t group);
  void release(size_t group);
  void flush();  // finishes background writes

  // Each group's fp32 grad norm as of its last reduction (0 after discard_all).
  const std::vector<float>& norms() const { return norms_; }
  // After a step, or an aborted backward: every shard is zeros again (no
  // I/O); shards still held (a failed reduction or step) are let go first.
  void discard_all();

  int64_t file_bytes() const { return swapper_->file_bytes(); }

 private:
  std::unique_ptr<StateSwapper> swapper_;
  std::vector<int> slots_;        // by group
  std::vector<float> norms_;      // by group
  std::vector<bool> held_;        // by group: held for a reduction or acquired by the step
};

}  // namespace zero::offload

// Engine checkpoints through a narrow interface: what a checkpoint reads
// and writes of an engine -- its flat groups' fp32 masters and optimizer
// state, its frozen params and buffers, the optimizer's counters and
// schedule, the step count -- and what the engine must do after a load.
// Each rank writes the fragments of params its shard holds; loading reads,
// for each param range a rank's new shard covers, whichever files hold it,
// so a checkpoint loads on any world size and stage. The file layout, the
// manifest and the atomic publish live in ckpt/ (no torch).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "engine/flat_optimizer.h"
#include "engine/module_state.h"
#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/stage_policy.h"

namespace zero {

struct CheckpointTarget {
  comm::Comm& comm;
  const comm::Group& dp;
  const Config& config;
  const StagePolicy& policy;
  const BatchConfig& batch;
  at::ScalarType param_dtype;
  std::vector<partition::FlatGroup>& groups;
  const std::vector<ReplicatedTensor>& replicated;
  FlatOptimizer& optimizer;
  int64_t& micro_steps;
  // A load failed after some ranks had overwritten their state: the engine
  // refuses to train until a load succeeds (set and cleared here).
  std::string& state_lost;
  std::function<void()> after_load;  // params follow the loaded masters; grads go
  std::function<void(const std::string&)> log;
};

// At a step boundary (the engine checks): DIR/.partial-TAG, then renamed.
// A save that fails on any rank (a full disk, one rank's write) is undone
// on every rank -- its files, DIR/.partial-TAG and DIR/latest.tmp removed --
// and every rank throws naming the cause; the engine's state is untouched.
// `exclude_frozen`: the frozen params left out (buffers are kept).
void save_checkpoint(CheckpointTarget& t, const std::string& dir, const std::string& tag,
                     const nlohmann::json& client_state, bool exclude_frozen = false);
// Returns the client state saved with it. Beside the weights it restores
// the optimizer's state and the step counters, each where asked. Not
// `strict`: frozen params the checkpoint lacks keep the model's values.
nlohmann::json load_checkpoint(CheckpointTarget& t, const std::string& dir, const std::string& tag,
                               bool optimizer_state = true, bool step_counters = true, bool strict = true);
void load_weights(CheckpointTarget& t, const std::string& path);

// Every rank learns whether any rank failed, so none goes on into a
// collective its peers will never join. Returns "" when none did; else this
// rank's own error, or (a rank that did not fail) "WHAT failed on rank R (host H): "
// and the lowest failing rank's error, so every rank says what went wrong.
// For a load (`wrote_state` given): if it failed after some rank had
// started overwriting its shards, `state_lost` is set; a clean failure
// leaves it as it was, a success clears it.
std::string agree(comm::Comm& comm, const comm::Group& dp, const std::string& what, const std::string& error,
                  const bool* wrote_state = nullptr, std::string* state_lost = nullptr);
// agree(), throwing its message as a std::runtime_error.
void agree_or_throw(comm::Comm& comm, const comm::Group& dp, const std::string& what, const std::string& error,
                    const bool* wrote_state = nullptr, std::string* state_lost = nullptr);

// safetensors' name for a dtype ("F32", "I64", ...), and back.
std::string safetensors_dtype(at::ScalarType t);
at::ScalarType scalar_type_of(const std::string& safetensors_dtype);

}  // namespace zero

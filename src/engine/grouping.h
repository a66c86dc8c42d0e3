// Grouping: the model's trainable params become flat groups, each
// flattened in place, synced from rank 0 and set up in the configured
// precision with its optimizer state.
//   stages 0-2: buckets of about reduce_bucket_size elements, params in
//     reverse registration order (about the order backward produces grads);
//   stage 3: one group per zero::Unit (adopting what zero::Init already
//     sharded), in reverse registration order, then the root: params outside
//     every unit, or registered in several units or also outside one.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "engine/precision.h"
#include "zero/stage_policy.h"
#include "partition/flat_group.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/unit.h"

namespace torch::nn {
class Module;
}

namespace zero {

class FlatOptimizer;

struct GroupingContext {
  const Config& config;
  const StagePolicy& policy;
  const Precision& precision;
  FlatOptimizer& optimizer;  // sets up each group's optimizer state
  comm::Comm& comm;
  const comm::Group& dp;
};

struct ModelGroups {
  std::vector<partition::FlatGroup> groups;
  // Stage 3: the model's units, their names, the group each uses (the root's
  // when all its params live there), which have no trainable params (they
  // stay pass-throughs), and which groups stay gathered (the root, units
  // under stage3_param_persistence_threshold).
  static constexpr size_t kNoGroup = static_cast<size_t>(-1);  // a unit without trainable params
  std::vector<UnitBase*> units;
  std::vector<std::string> unit_names;
  std::vector<size_t> unit_to_group;
  std::vector<bool> unit_has_params;
  std::vector<bool> persistent;
  // The root unit's group (params outside every unit, and those shared
  // between units), kNoGroup when there is none. It stays gathered unless
  // the forward runs inside engine.forward() and it has at least
  // stage3_param_persistence_threshold elements (root_shardable).
  size_t root_group = kNoGroup;
  bool root_shardable = false;
  // Trainable params registered under more than one name (tied weights):
  // the names after the first, for state_dict().
  std::unordered_map<const void*, std::vector<std::string>> other_names;
  int64_t num_params = 0;            // trainable elements, unpadded
  int64_t largest_group_bytes = 0;   // the flatten's extra peak over the model itself
  int64_t sharded_at_init_units = 0;
  std::string note;                  // what grouping did, for describe()
};

ModelGroups group_params(torch::nn::Module& model, const GroupingContext& ctx);

}  // namespace zero

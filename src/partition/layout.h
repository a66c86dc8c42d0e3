// Where each parameter sits in its flat group, and which rank owns what.
// Pure index arithmetic (no torch), so it is cheap to test exhaustively.
//
// A flat group lays its params end to end, then pads the total so it splits
// into dp_size equal shards whose sizes are multiples of `align` elements
// (so every shard starts on a vector-width boundary). Rank r owns elements
// [r * shard_numel, (r + 1) * shard_numel). A param may straddle shards; its
// fragments say which piece each rank owns.
#pragma once

#include <cstdint>
#include <vector>

namespace zero::partition {

// Shards start on 64-byte boundaries for fp32 (16 elements), so vector
// loops over a shard never straddle its edge.
constexpr int64_t kShardAlignElements = 16;

struct ParamSlot {
  int64_t param_index = 0;  // index into the caller's param list
  int64_t offset = 0;       // element offset in the flat group
  int64_t numel = 0;
};

// The piece of one param that one rank owns.
struct Fragment {
  int64_t param_index = 0;
  int64_t param_offset = 0;  // offset inside the param (flattened)
  int64_t shard_offset = 0;  // offset inside the owning rank's shard
  int64_t numel = 0;
};

struct GroupLayout {
  std::vector<ParamSlot> params;
  int64_t numel = 0;         // sum of param sizes
  int64_t padded_numel = 0;  // dp_size * shard_numel
  int64_t shard_numel = 0;
  int dp_size = 1;

  // The fragments rank `rank` owns, in flat order.
  std::vector<Fragment> fragments(int rank) const;
};

GroupLayout make_group_layout(const std::vector<int64_t>& param_numels,
                              const std::vector<int64_t>& param_indices, int dp_size, int64_t align);

// Splits params (given in the order groups should be filled) into buckets of
// about `bucket_numel` elements: a bucket closes once it reaches the size, so
// a param larger than the bucket gets a bucket of its own. Returns the
// indices of each bucket's params.
std::vector<std::vector<int64_t>> bucket_params(const std::vector<int64_t>& numels_in_order,
                                                const std::vector<int64_t>& indices_in_order,
                                                int64_t bucket_numel);

}  // namespace zero::partition

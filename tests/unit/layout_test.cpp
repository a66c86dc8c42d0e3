// Flat-group layout arithmetic, exhaustively over small cases: padding to
// aligned equal shards, fragments covering every element exactly once, and
// the bucketing of params into groups.
#include <algorithm>
#include <gtest/gtest.h>

#include "partition/layout.h"

namespace {


TEST(Layout, PadsToAlignedEqualShardsAndFragmentsCoverEveryElement) {
  using namespace zero::partition;
  for (int dp : {1, 2, 3, 4, 8})
    for (int64_t align : {1, 16}) {
      const std::vector<int64_t> numels{5, 1, 300, 17, 64};
      auto g = make_group_layout(numels, {4, 3, 2, 1, 0}, dp, align);
      EXPECT_EQ(g.numel, 387);
      EXPECT_EQ(g.padded_numel % (dp * align), 0);
      EXPECT_GE(g.padded_numel, g.numel);
      EXPECT_LT(g.padded_numel - g.numel, dp * align);
      EXPECT_EQ(g.shard_numel * dp, g.padded_numel);
      // Every element of every param is owned by exactly one rank.
      std::vector<std::vector<int>> owned(5);
      for (size_t i = 0; i < numels.size(); ++i) owned[4 - i].assign(numels[i], 0);
      for (int r = 0; r < dp; ++r)
        for (const auto& f : g.fragments(r)) {
          EXPECT_LE(f.shard_offset + f.numel, g.shard_numel);
          for (int64_t k = 0; k < f.numel; ++k) owned[f.param_index][f.param_offset + k]++;
          // The fragment's flat position is consistent with the param's slot.
          const auto& slot = *std::find_if(g.params.begin(), g.params.end(),
                                           [&](const ParamSlot& s) { return s.param_index == f.param_index; });
          EXPECT_EQ(slot.offset + f.param_offset, r * g.shard_numel + f.shard_offset);
        }
      for (const auto& p : owned)
        for (int c : p) EXPECT_EQ(c, 1);
    }
}

TEST(Layout, BucketsCloseAtTheSizeAndBigParamsStandAlone) {
  using zero::partition::bucket_params;
  auto b = bucket_params({10, 10, 10, 100, 5}, {4, 3, 2, 1, 0}, 20);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(b[1], (std::vector<int64_t>{2, 1}));  // closes once it reaches 20 (here 110)
  EXPECT_EQ(b[2], (std::vector<int64_t>{0}));
  EXPECT_EQ(bucket_params({1000}, {0}, 1).size(), 1u);
}

}  // namespace

// Which hosts a group's ranks are on, for hierarchical collectives and hpZ.
#include "comm/host_layout.h"

#include <gtest/gtest.h>

namespace {

using zero::comm::host_layout;

TEST(HostLayout, InterleavedRanksMapToHostsAndLocalIndices) {
  const auto lay = host_layout({"a", "b", "a", "b", "a", "b"});
  ASSERT_TRUE(lay);
  EXPECT_EQ(lay->hosts, 2);
  EXPECT_EQ(lay->per_host, 3);
  EXPECT_EQ(lay->host_of, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(lay->local_of, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(lay->ranks_on_host(1), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(lay->ranks_at_local(2), (std::vector<int>{4, 5}));
}

TEST(HostLayout, NoHierarchyOnOneHostOneRankPerHostOrUnevenHosts) {
  EXPECT_FALSE(host_layout({"a", "a", "a"}));
  EXPECT_FALSE(host_layout({"a", "b", "c"}));
  EXPECT_FALSE(host_layout({"a", "a", "b"}));
  EXPECT_TRUE(host_layout({"a", "a", "b", "b"}));
}

}  // namespace

#include <gtest/gtest.h>

#include "zero/comm_counters.h"

namespace {

using namespace zero::comm;

TEST(CommCounters, SumsPerOpGroupAndTransport) {
  CommCounters c;
  c.record("dp0", CollectiveOp::AllGather, "gloo", 100, 50);
  c.record("dp0", CollectiveOp::AllGather, "shm", 100, 50);
  c.record("dp1", CollectiveOp::AllGather, "gloo", 8, 4);
  c.record("dp0", CollectiveOp::ReduceScatter, "gloo", 40, 20);
  auto before = c.totals();
  c.record("dp0", CollectiveOp::ReduceScatter, "gloo", 40, 20);

  auto t = c.totals();
  EXPECT_EQ(t["allgather"].calls, 3);
  EXPECT_EQ(t["allgather"].bytes, 208);
  EXPECT_EQ(t["allgather"].calls_by_transport["gloo"], 2);
  EXPECT_EQ(t["allgather"].calls_by_transport["shm"], 1);
  EXPECT_EQ(t["allgather"].bytes_by_transport["gloo"], 108);
  EXPECT_EQ(t["allgather"].bytes_by_transport["shm"], 100);
  EXPECT_EQ(c.for_group("dp1")["allgather"].wire_bytes, 4);
  EXPECT_TRUE(c.for_group("tp0").empty());

  auto d = diff(t, before);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d["reduce_scatter"].calls, 1);
  EXPECT_EQ(d["reduce_scatter"].bytes, 40);
  EXPECT_EQ(d["reduce_scatter"].bytes_by_transport["gloo"], 40);
  c.record("dp0", CollectiveOp::AllGather, "shm", 100, 50);
  auto d2 = diff(c.totals(), t);  // only shm served the allgather in between
  EXPECT_EQ(d2["allgather"].calls_by_transport, (std::map<std::string, int64_t>{{"shm", 1}}));
  EXPECT_EQ(d2["allgather"].bytes_by_transport, (std::map<std::string, int64_t>{{"shm", 100}}));

  c.reset();
  EXPECT_TRUE(c.totals().empty());
}

}  // namespace

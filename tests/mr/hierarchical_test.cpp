// Hierarchical collectives (comm/hierarchical_transport.h) on a world that
// spans hosts evenly -- multihost_test.sh runs this binary on two hosts
// simulated by network namespaces; elsewhere these tests skip. Each op is
// checked against the flat path (Gloo across all ranks) on the same data,
// and the bytes that crossed the link between the hosts (the interface's
// own counters) against the algorithms' formulas.
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "comm/hierarchical_transport.h"

#include "mr.h"

namespace {

using zero::comm::ReduceOp;
using zero::test::world;

const zero::comm::HierGroup* layout_or_skip() { return zero::comm::hier_group(world().group()); }

// Small integers: exact in every dtype and in any order of summation, so
// the hierarchical and flat sums must agree bit for bit.
at::Tensor rank_data(int rank, int64_t n, at::ScalarType dt) {
  return (at::arange(n, at::kFloat).fmod(13) + rank * 17).to(dt);
}

// Runs `op` with the fast paths on (hierarchical where it pays) and off
// (flat Gloo); returns both results and the transport that served the first.
template <typename Op>
std::tuple<at::Tensor, at::Tensor, std::string> both_ways(const std::string& name, Op&& op) {
  auto& comm = world().comm();
  const auto before = comm.counters().totals();
  at::Tensor fast = op();
  std::string served;
  for (const auto& [o, c] : zero::comm::diff(comm.counters().totals(), before))
    if (o == name)
      for (const auto& [t, calls] : c.calls_by_transport)
        if (calls > 0) served += t;
  comm.set_fast_paths_enabled(false);
  at::Tensor flat = op();
  comm.set_fast_paths_enabled(true);
  return {fast, flat, served};
}

TEST(Hierarchical, EveryOpAgreesWithTheFlatPath) {
  const auto* h = layout_or_skip();
  if (!h) GTEST_SKIP() << "the world is on one host";
  auto& comm = world().comm();
  const auto& g = world().group();
  const int n_ranks = g.size(), me = g.rank();
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {1, 7, 1000, 300001}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " x " + std::to_string(n));
      auto [ag, ag_flat, ag_by] = both_ways("allgather", [&] {
        at::Tensor out = at::empty({n * n_ranks}, at::TensorOptions().dtype(dt));
        comm.all_gather(g, out, rank_data(me, n, dt))->wait();
        return out;
      });
      EXPECT_TRUE(ag.equal(ag_flat));
      EXPECT_EQ(ag_by, "hier");
      auto [rs, rs_flat, rs_by] = both_ways("reduce_scatter", [&] {
        at::Tensor out = at::empty({n}, at::TensorOptions().dtype(dt));
        comm.reduce_scatter(g, out, rank_data(me, n * n_ranks, dt))->wait();
        return out;
      });
      EXPECT_TRUE(rs.equal(rs_flat));
      // 16-bit on 2 ranks per host: fp32 partial sums would cross as many bytes.
      const bool pays = dt == at::kFloat || h->layout.per_host > 2;
      EXPECT_EQ(rs_by, pays ? "hier" : "gloo");
      auto [ar, ar_flat, ar_by] = both_ways("all_reduce", [&] {
        at::Tensor t = rank_data(me, n, dt);
        comm.all_reduce(g, t)->wait();
        return t;
      });
      EXPECT_TRUE(ar.equal(ar_flat));
      EXPECT_EQ(ar_by, "hier");
    }
  }
  // Averages and sums of random values: the same up to the association.
  at::manual_seed(100 + me);
  at::Tensor x = at::randn({4099 * n_ranks});
  auto [avg, avg_flat, by] = both_ways("reduce_scatter", [&] {
    at::Tensor out = at::empty({4099});
    comm.reduce_scatter(g, out, x, ReduceOp::Avg)->wait();
    return out;
  });
  EXPECT_TRUE(avg.allclose(avg_flat, 1e-6, 1e-6));
  auto [sum, sum_flat, by2] = both_ways("all_reduce", [&] {
    at::Tensor t = x.clone();
    comm.all_reduce(g, t, ReduceOp::Avg)->wait();
    return t;
  });
  EXPECT_TRUE(sum.allclose(sum_flat, 1e-6, 1e-6));
  // Every rank holds the same bits (one order of summation for all).
  at::Tensor all = at::empty({sum.numel() * n_ranks});
  comm.all_gather(g, all, sum)->wait();
  for (int r = 0; r < n_ranks; ++r) EXPECT_TRUE(all.narrow(0, r * sum.numel(), sum.numel()).equal(sum)) << r;
}

// Bytes this host sent on its link to the other hosts (GLOO_SOCKET_IFNAME's
// interface: the veth end in the namespace tests).
int64_t link_tx_bytes() {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  int64_t v = -1;
  std::ifstream(std::string("/sys/class/net/") + ifname + "/statistics/tx_bytes") >> v;
  return v;
}

TEST(Hierarchical, BytesBetweenHostsMatchTheFormulas) {
  const auto* h = layout_or_skip();
  if (!h) GTEST_SKIP() << "the world is on one host";
  if (!std::getenv("GLOO_SOCKET_IFNAME")) GTEST_SKIP() << "GLOO_SOCKET_IFNAME names no link to count on";
  auto& comm = world().comm();
  const auto& g = world().group();
  const int64_t N = g.size(), H = h->layout.hosts, L = h->layout.per_host;
  const int64_t S = 1 << 20, reps = 4;  // 4 MiB fp32 shards
  // Bytes across all hosts for one call: what each measured op's algorithm sends.
  auto measure = [&](bool hierarchical, const std::function<void()>& op) {
    comm.set_fast_paths_enabled(hierarchical);
    op();  // warm: connections, scratch
    // Read between two barriers: no rank starts sending before it is read.
    comm.barrier(g)->wait();
    const int64_t before = h->local == 0 ? link_tx_bytes() : 0;
    comm.barrier(g)->wait();
    for (int i = 0; i < reps; ++i) op();
    comm.barrier(g)->wait();
    at::Tensor sent = at::tensor({static_cast<double>(h->local == 0 ? link_tx_bytes() - before : 0)}, at::kDouble);
    comm.set_fast_paths_enabled(false);
    comm.all_reduce(g, sent)->wait();
    comm.set_fast_paths_enabled(true);
    return sent.item<double>() / reps;
  };
  at::Tensor shard = at::ones({S}), full = at::empty({S * N}), grads = at::ones({S * N});
  auto gather = [&] { comm.all_gather(g, full, shard)->wait(); };
  auto scatter = [&] { comm.reduce_scatter(g, shard, grads)->wait(); };
  auto reduce = [&] { comm.all_reduce(g, grads)->wait(); };
  const double B = 4.0 * S;  // one shard's bytes
  struct Case {
    const char* what;
    std::function<void()> op;
    bool hierarchical;
    double formula;
  };
  const Case cases[] = {
      {"allgather, flat ring", gather, false, H * (N - 1) * B},
      {"allgather, hierarchical", gather, true, N * (H - 1) * B},
      {"reduce-scatter, flat all-to-all", scatter, false, N * (N - L) * B},
      {"reduce-scatter, hierarchical", scatter, true, N * (H - 1) * B},
      {"all-reduce, flat ring", reduce, false, 2.0 * H * (N - 1) * N * B / N},
      {"all-reduce, hierarchical", reduce, true, 2.0 * (H - 1) * N * B},
  };
  for (const auto& c : cases) {
    const double got = measure(c.hierarchical, c.op);
    if (g.rank() == 0) std::printf("%-34s %12.0f bytes between hosts per call, formula %12.0f (%.3f)\n", c.what, got,
                                   c.formula, got / c.formula);
    // TCP/IP headers and acks, the signature records and two barriers add a few percent.
    EXPECT_GE(got / c.formula, 1.0) << c.what;
    EXPECT_LE(got / c.formula, 1.08) << c.what;
  }
}

}  // namespace

// A rank failing alone tears down its world while collectives it issued
// wait for peers that will never join them (the peers are alive, busy
// elsewhere): the running one's wait between hosts is given up, the queued
// ones are cancelled, and the shutdown takes seconds, not a collective
// timeout per collective. Run alone (multihost_test.sh: it ends the world),
// with ZERO_COLLECTIVE_TIMEOUT_S well above the bound checked.
TEST(HierarchicalTeardown, ARankFailingAloneShutsDownInSeconds) {
  if (!layout_or_skip()) GTEST_SKIP() << "the world does not span hosts evenly";
  if (world().rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(12));  // alive, but never joins rank 0's collectives
    return;
  }
  const int n = world().size();
  std::vector<at::Tensor> outs;
  std::vector<zero::comm::WorkHandle> issued;
  for (int k = 0; k < 3; ++k) {
    outs.push_back(at::empty({4 * n}));
    issued.push_back(world().comm().all_gather(world().group(), outs.back(), at::ones({4}), "lone allgather"));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the first is waiting between hosts
  const auto t0 = std::chrono::steady_clock::now();
  world().shutdown();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("teardown with %zu collectives left took %.2f s\n", issued.size(), took);
  EXPECT_LT(took, 5.0);
  for (auto& w : issued) EXPECT_THROW(w->wait(), zero::comm::CommError);
}

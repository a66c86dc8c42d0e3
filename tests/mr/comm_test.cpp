// Collectives on real processes, checked against values each rank computes
// locally: every dtype, sizes that do and don't divide by the group size,
// sub-groups, counters, argument errors, and timeouts -- each on both
// transports: the shared-memory fast path (all ranks here share a host) and
// Gloo, which must agree bit for bit.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/gloo_transport.h"
#include "comm/shm/lane.h"
#include "comm/shm_transport.h"
#include "memory/page_buffer.h"

#include "mr.h"

namespace {

using zero::comm::CommError;
using zero::comm::Group;
using zero::comm::ReduceOp;
using zero::test::world;

const at::ScalarType kDTypes[] = {at::kFloat, at::kHalf, at::kBFloat16};
// 300001 fp32 elements span several shared-memory rounds (512 KiB slots).
const int64_t kSizes[] = {1, 7, 1000, 65537, 300001};

// A fresh group of every rank: its own lanes (a test that makes them fail
// leaves the world's alone).
std::shared_ptr<Group> every_rank_group(const std::string& name) {
  std::vector<int> all(world().size());
  for (int r = 0; r < world().size(); ++r) all[r] = r;
  return world().new_group(all, name);
}

// Runs `body` on the shared-memory fast path, then on Gloo, and checks the
// counters say which transport served the calls.
template <typename F>
void for_each_transport(F&& body) {
  auto& comm = world().comm();
  for (const char* transport : {"shm", "gloo"}) {
    SCOPED_TRACE(transport);
    comm.set_fast_paths_enabled(std::string(transport) == "shm");
    const auto before = comm.counters().totals();
    body();
    for (const auto& [op, c] : zero::comm::diff(comm.counters().totals(), before)) {
      if (op == "barrier") continue;  // always the backend's
      const auto served = c.calls_by_transport.find(transport);
      EXPECT_EQ(served == c.calls_by_transport.end() ? 0 : served->second, c.calls) << op;
    }
  }
  comm.set_fast_paths_enabled(true);
}

// Rank r's data: small integers (exact in every dtype and in sums of a few ranks).
at::Tensor rank_data(int rank, int64_t n, at::ScalarType dt, int salt = 0) {
  return (at::arange(n, at::kFloat).fmod(13) + rank * 17 + salt).to(dt);
}

// Routing by device: CPU tensors to the shared-memory path or Gloo; CUDA
// tensors, when the build has CUDA, to NCCL, or to CUDA IPC where ranks of
// one host share a GPU -- decided at a group's first CUDA collective from
// where its ranks' GPUs are (comm/device_placement.h, unit-tested; the GPU
// suite checks the choice on a GPU); anything else named.
TEST(Routing, ByDevice) {
  auto& comm = world().comm();
  const Group& g = world().group();
  const auto op = zero::comm::CollectiveOp::AllGather;
  const at::Device gpu(at::kCUDA, 0);
  EXPECT_EQ(comm.route_name(g, op, at::kFloat, 64, at::kCPU), "shm");
  comm.set_fast_paths_enabled(false);
  EXPECT_EQ(comm.route_name(g, op, at::kFloat, 64, at::kCPU), "gloo");
#ifdef ZERO_TEST_WITH_CUDA
  EXPECT_EQ(comm.route_name(g, op, at::kBFloat16, 64, gpu), "nccl");
#endif
  comm.set_fast_paths_enabled(true);
#ifndef ZERO_TEST_WITH_CUDA
  EXPECT_NE(comm.route_name(g, op, at::kBFloat16, 64, at::Device(at::kCUDA, 0)).find("built without CUDA"),
            std::string::npos);
#endif
  EXPECT_NE(comm.route_name(g, op, at::kFloat, 64, at::kMeta).find("tensors on meta are not supported"),
            std::string::npos);
  const at::Tensor cpu = at::zeros({2 * g.size()});
  EXPECT_THROW(comm.all_gather(g, cpu, at::zeros({2}, at::TensorOptions().device(at::kMeta))), CommError);
}

// The lane's external collectives, which the CUDA IPC transport's
// handshakes are: each handshake returns only when every rank has reached
// it (each rank leaves a file before it and finds all of them after), and
// ranks that run different collectives fail on every rank, naming both.
TEST(ShmLane, ExternalHandshakesWaitForEveryRankAndCheckSignatures) {
  auto g = every_rank_group("lane-external");  // its own lanes: a mismatch leaves them failed
  zero::comm::shm::Lane* lane = zero::comm::shm_lane(*g, zero::comm::CollectiveOp::AllGather);
  if (!lane) GTEST_SKIP() << "no shared-memory segment for this group";
  const char* job = std::getenv("ZERO_JOB_ID");
  const std::string dir = std::filesystem::temp_directory_path().string() + "/zero-lane-" + (job ? job : "0");
  std::filesystem::create_directories(dir);
  const int r = g->rank(), n = g->size();
  int seen_after_first = -1;
  lane->external("test", zero::comm::make_signature_record("the same"), nullptr,
                 [&](const zero::comm::shm::Lane::Handshake& handshake) {
                   std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));  // later ranks arrive later
                   std::ofstream(dir + "/" + std::to_string(r)) << r;
                   handshake();
                   seen_after_first = 0;
                   for (int q = 0; q < n; ++q) seen_after_first += std::filesystem::exists(dir + "/" + std::to_string(q));
                   handshake();  // nobody removes the files before everyone looked
                 })
      ->wait();
  EXPECT_EQ(seen_after_first, n);
  if (r == 0) std::filesystem::remove_all(dir);
  auto mismatch = lane->external("test", zero::comm::make_signature_record(r == 0 ? "one thing" : "another"), nullptr,
                                 [](const zero::comm::shm::Lane::Handshake& handshake) { handshake(); });
  try {
    mismatch->wait();
    ADD_FAILURE() << "ranks with different signatures must fail";
  } catch (const zero::comm::shm::Mismatch& e) {
    EXPECT_NE(std::string(e.what()).find("one thing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("another"), std::string::npos) << e.what();
  }
}

// An external collective's round that carries bytes (the CUDA IPC
// transport's direct path publishes where each rank's input is so): every
// rank gets every rank's bytes, in rank order, each round its own -- also
// when a slower rank is still a round behind; more than a slot is refused.
TEST(ShmLane, ExternalExchangesCarryEveryRanksBytes) {
  const Group& g = world().group();
  zero::comm::shm::Lane* lane = zero::comm::shm_lane(g, zero::comm::CollectiveOp::AllGather);
  if (!lane) GTEST_SKIP() << "no shared-memory segment for this group";
  const int r = g.rank(), n = g.size();
  constexpr size_t kBytes = 300;
  std::vector<std::vector<unsigned char>> seen(3, std::vector<unsigned char>(n * kBytes));
  std::string too_big;
  lane->external("test", zero::comm::make_signature_record("exchange"), nullptr,
                 [&](const zero::comm::shm::Lane::Handshake& rounds) {
                   for (int t = 0; t < 3; ++t) {
                     if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                     std::vector<unsigned char> mine(kBytes);
                     for (size_t i = 0; i < kBytes; ++i) mine[i] = static_cast<unsigned char>(31 * r + 7 * t + i);
                     rounds.exchange(mine.data(), kBytes, seen[t].data());
                   }
                   try {
                     std::vector<char> big(static_cast<size_t>(lane->slot_bytes()) + 1);
                     rounds.exchange(big.data(), big.size(), nullptr);
                   } catch (const std::invalid_argument& e) {
                     too_big = e.what();
                   }
                 })
      ->wait();
  for (int t = 0; t < 3; ++t)
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < kBytes; i += 37)
        EXPECT_EQ(seen[t][q * kBytes + i], static_cast<unsigned char>(31 * q + 7 * t + i)) << "round " << t << ", rank " << q;
  EXPECT_NE(too_big.find("more than its slots'"), std::string::npos) << too_big;
}

// Who runs a lane's collectives: the lane's worker, or a caller waiting for
// one (no hand-over to the worker and back when it waits at once). Either
// way in submission order; collectives nobody waits for still run; several
// threads waiting on one lane all return.
TEST(ShmLane, WaitingCallersRunTheQueueInOrderAndTheWorkerRunsTheRest) {
  const Group& g = world().group();
  zero::comm::shm::Lane* lane = zero::comm::shm_lane(g, zero::comm::CollectiveOp::AllGather);
  if (!lane) GTEST_SKIP() << "no shared-memory segment for this group";
  const auto sig = zero::comm::make_signature_record("lane order");
  const auto round = [](const zero::comm::shm::Lane::Handshake& handshake) { handshake(); };

  // In order, whoever runs them: waiting on the last runs all before it.
  std::vector<int> order;
  std::vector<std::shared_ptr<zero::comm::shm::Job>> jobs;
  for (int i = 0; i < 6; ++i)
    jobs.push_back(lane->external("test", sig, nullptr, [&, i](const zero::comm::shm::Lane::Handshake& handshake) {
      handshake();
      order.push_back(i);
    }));
  jobs.back()->wait();
  for (auto& j : jobs) EXPECT_TRUE(j->done());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));

  // A caller that waits at once mostly runs its collective itself (with
  // stealing off: none of them).
  int on_caller = 0;
  const auto me = std::this_thread::get_id();
  for (int i = 0; i < 200; ++i)
    lane->external("test", sig, nullptr, [&](const zero::comm::shm::Lane::Handshake& handshake) {
          handshake();
          on_caller += std::this_thread::get_id() == me;
        })
        ->wait();
  std::printf("collectives run by the waiting caller: %d of 200\n", on_caller);
  EXPECT_GT(on_caller, 0) << "every collective was handed to the worker";

  // Nobody waits: the worker runs it.
  auto unwaited = lane->external("test", sig, nullptr, round);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!unwaited->done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(unwaited->done());

  // Two threads waiting on one lane's collectives at once.
  auto first = lane->external("test", sig, nullptr, round);
  auto second = lane->external("test", sig, nullptr, round);
  std::thread other([&] { second->wait(); });
  first->wait();
  other.join();
  EXPECT_TRUE(first->done() && second->done());
}

TEST(Collectives, AllGatherIntoFlat) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    for (auto dt : kDTypes)
      for (int64_t n : kSizes) {
        SCOPED_TRACE(std::string(c10::toString(dt)) + " shard " + std::to_string(n));
        auto full = at::empty({n * g.size()}, dt);
        comm.all_gather(g, full, rank_data(g.rank(), n, dt))->wait();
        std::vector<at::Tensor> parts;
        for (int r = 0; r < g.size(); ++r) parts.push_back(rank_data(r, n, dt));
        EXPECT_TRUE(full.equal(at::cat(parts)));
      }
  });
}

// Mixed precision with fp32 compute: 16-bit shards widened into an fp32
// buffer as they land, counted in the 16 bits that travel. Values that are
// not small integers, so a wrong conversion (bits copied, not converted) shows.
TEST(Collectives, AllGatherWidensSixteenBitShards) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    for (auto dt : {at::kBFloat16, at::kHalf})
      for (int64_t n : kSizes) {
        SCOPED_TRACE(std::string(c10::toString(dt)) + " shard " + std::to_string(n));
        at::manual_seed(n + g.rank());
        const at::Tensor shard = at::randn({n}).to(dt);
        auto full = at::empty({n * g.size()}, at::kFloat);
        const auto before = comm.counters().totals();
        comm.all_gather(g, full, shard)->wait();
        const auto counted = zero::comm::diff(comm.counters().totals(), before).at("allgather");
        EXPECT_EQ(counted.bytes, 2 * n * g.size());
        auto low = at::empty({n * g.size()}, dt);
        comm.all_gather(g, low, shard)->wait();
        EXPECT_TRUE(full.equal(low.to(at::kFloat)));
      }
  });
}

TEST(Collectives, AllGatherInPlaceShard) {
  for_each_transport([&] {
    // ZeRO's common case: the input shard is this rank's slot of the output.
    auto& comm = world().comm();
    const Group& g = world().group();
    const int64_t n = 1001;
    auto full = at::zeros({n * g.size()}, at::kFloat);
    full.narrow(0, g.rank() * n, n).copy_(rank_data(g.rank(), n, at::kFloat));
    comm.all_gather(g, full, full.narrow(0, g.rank() * n, n))->wait();
    for (int r = 0; r < g.size(); ++r) EXPECT_TRUE(full.narrow(0, r * n, n).equal(rank_data(r, n, at::kFloat)));
  });
}

TEST(Collectives, ReduceScatterSumAndAvg) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    for (auto dt : kDTypes)
      for (int64_t n : kSizes)
        for (auto op : {ReduceOp::Sum, ReduceOp::Avg})
          for (bool widen : {false, true}) {
            if (widen && dt == at::kFloat) continue;
            SCOPED_TRACE(std::string(c10::toString(dt)) + " n " + std::to_string(n) +
                         (op == ReduceOp::Avg ? " avg" : " sum") + (widen ? " -> fp32" : ""));
            const at::ScalarType out_dt = widen ? at::kFloat : dt;
            auto out = at::empty({n}, out_dt);
            comm.reduce_scatter(g, out, rank_data(g.rank(), n * g.size(), dt), op)->wait();
            // Local oracle: fp32 sum in rank order, one rounding.
            auto acc = at::zeros({n}, at::kFloat);
            for (int r = 0; r < g.size(); ++r)
              acc.add_(rank_data(r, n * g.size(), dt).narrow(0, g.rank() * n, n).to(at::kFloat));
            if (op == ReduceOp::Avg) acc.div_(g.size());
            EXPECT_TRUE(out.equal(acc.to(out_dt)));
          }
  });
}

TEST(Collectives, AllReduce) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    for (auto dt : kDTypes)
      for (int64_t n : kSizes)
        for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) {
          SCOPED_TRACE(std::string(c10::toString(dt)) + " n " + std::to_string(n));
          auto t = rank_data(g.rank(), n, dt);
          comm.all_reduce(g, t, op)->wait();
          auto acc = at::zeros({n}, at::kFloat);
          for (int r = 0; r < g.size(); ++r) acc.add_(rank_data(r, n, dt).to(at::kFloat));
          if (op == ReduceOp::Avg) acc.div_(g.size());
          // Gloo's ring sums fp32 in a different order; the inputs are small
          // integers, so every order is exact.
          EXPECT_TRUE(t.equal(acc.to(dt)));
        }
  });
}

TEST(Collectives, Broadcast) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    for (int root : {0, g.size() - 1})
      for (auto dt : {at::kFloat, at::kHalf, at::kBFloat16, at::kBool, at::kLong}) {
        auto t = rank_data(g.rank(), 77, at::kFloat).fmod(2).to(dt);
        comm.broadcast(g, t, root)->wait();
        EXPECT_TRUE(t.equal(rank_data(root, 77, at::kFloat).fmod(2).to(dt))) << c10::toString(dt);
      }
    comm.barrier(g)->wait();
  });
}

TEST(Collectives, ManyInFlightCompleteInAnyWaitOrder) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    std::vector<at::Tensor> ts;
    std::vector<zero::comm::WorkHandle> ws;
    for (int i = 0; i < 8; ++i) {
      ts.push_back(at::full({4096}, g.rank() + i, at::kFloat));
      ws.push_back(comm.all_reduce(g, ts.back()));
    }
    for (int i = 7; i >= 0; --i) ws[i]->wait();
    const double base = g.size() * (g.size() - 1) / 2.0;
    for (int i = 0; i < 8; ++i) EXPECT_TRUE(ts[i].eq(base + g.size() * i).all().item<bool>());
  });
}

TEST(SubGroups, EachGroupSeesOnlyItsRanks) {
  auto& w = world();
  if (w.size() % 2) GTEST_SKIP() << "needs an even world";
  // DP groups of 2 consecutive ranks: {0,1}, {2,3}, ... -- on the fast path
  // too, whose segment is per group (the seed's first review bug was a fast
  // path that ignored the group).
  auto dp = w.split(2, "dp");
  ASSERT_TRUE(dp);
  EXPECT_EQ(dp->size(), 2);
  EXPECT_EQ(dp->rank(), w.rank() % 2);
  const int first = w.rank() - w.rank() % 2;
  for_each_transport([&] {
    auto t = at::full({5}, w.rank() + 1.0, at::kFloat);
    w.comm().all_reduce(*dp, t)->wait();
    EXPECT_TRUE(t.eq((first + 1) + (first + 2)).all().item<bool>());

    auto full = at::empty({6}, at::kBFloat16);
    w.comm().all_gather(*dp, full, at::full({3}, static_cast<double>(w.rank()), at::kBFloat16))->wait();
    EXPECT_EQ(full[0].item<float>(), first);
    EXPECT_EQ(full[5].item<float>(), first + 1);

    auto out = at::empty({4}, at::kFloat);
    w.comm().reduce_scatter(*dp, out, at::full({8}, static_cast<double>(w.rank()), at::kFloat))->wait();
    EXPECT_TRUE(out.eq(2 * first + 1).all().item<bool>());
  });
  EXPECT_EQ(w.comm().counters().for_group(dp->name())["all_reduce"].calls, 2);
}

TEST(SubGroups, NonContiguousAndNonMembers) {
  auto& w = world();
  if (w.size() < 3) GTEST_SKIP() << "needs 3+ ranks";
  auto g = w.new_group({0, 2}, "evens");
  EXPECT_EQ(static_cast<bool>(g), w.rank() == 0 || w.rank() == 2);
  if (g) {
    for_each_transport([&] {
      auto t = at::full({3}, w.rank() + 1.0, at::kFloat);
      w.comm().all_reduce(*g, t)->wait();
      EXPECT_TRUE(t.eq(1 + 3).all().item<bool>());
      auto b = at::full({3}, static_cast<double>(w.rank()), at::kFloat);
      w.comm().broadcast(*g, b, 1)->wait();  // group rank 1 = world rank 2
      EXPECT_TRUE(b.eq(2).all().item<bool>());
    });
  }
  w.comm().barrier(w.group())->wait();
}

TEST(Counters, ExactCallsAndBytes) {
  auto& comm = world().comm();
  const Group& g = world().group();
  const int64_t N = g.size();
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shm" : "gloo");
    comm.set_fast_paths_enabled(shm);
    comm.barrier(g)->wait();
    auto before = comm.counters().totals();

    comm.all_gather(g, at::empty({10 * N}, at::kFloat), at::zeros({10}, at::kFloat))->wait();
    for (int i = 0; i < 2; ++i)
      comm.reduce_scatter(g, at::empty({4}, at::kFloat), at::zeros({4 * N}, at::kHalf))->wait();
    comm.all_reduce(g, at::zeros({7}, at::kBFloat16))->wait();
    comm.broadcast(g, at::zeros({3}, at::kDouble))->wait();
    comm.barrier(g)->wait();

    auto d = zero::comm::diff(comm.counters().totals(), before);
    const char* t = shm ? "shm" : "gloo";
    EXPECT_EQ(d["allgather"].calls, 1);
    EXPECT_EQ(d["allgather"].bytes, 10 * N * 4);
    // Wire bytes: what this rank sends (Gloo) or copies into the segment (shm).
    EXPECT_EQ(d["allgather"].wire_bytes, shm ? 10 * 4 : (N - 1) * 10 * 4);
    EXPECT_EQ(d["allgather"].calls_by_transport[t], 1);
    EXPECT_EQ(d["reduce_scatter"].calls, 2);
    EXPECT_EQ(d["reduce_scatter"].bytes, 2 * 4 * N * 2);  // counted in the input's 16-bit dtype
    EXPECT_EQ(d["reduce_scatter"].wire_bytes, shm ? 2 * 4 * N * 2 : 2 * (N - 1) * 4 * 2);
    EXPECT_EQ(d["reduce_scatter"].calls_by_transport[t], 2);
    EXPECT_EQ(d["all_reduce"].calls, 1);
    EXPECT_EQ(d["all_reduce"].bytes, 7 * 2);
    // bf16 travels as fp32 in Gloo; shared memory moves the 16-bit values.
    EXPECT_EQ(d["all_reduce"].wire_bytes, shm ? 7 * 2 : 2 * (N - 1) * 7 * 4 / N);
    EXPECT_EQ(d["broadcast"].bytes, 3 * 8);
    EXPECT_EQ(d["broadcast"].calls_by_transport[t], 1);
    EXPECT_EQ(d["barrier"].calls, 1);
    EXPECT_EQ(d.size(), 5u);
  }
  comm.set_fast_paths_enabled(true);
}

// Random (not integer) data: the fast path's sums must round exactly as
// Gloo's fallback does (rank order, fp32 accumulation, one rounding).
TEST(ShmFastPath, BitIdenticalToGloo) {
  auto& comm = world().comm();
  const Group& g = world().group();
  const int N = g.size();
  auto run = [&](bool shm, auto&& op) {
    comm.set_fast_paths_enabled(shm);
    auto out = op();
    comm.set_fast_paths_enabled(true);
    return out;
  };
  for (auto dt : kDTypes)
    for (int64_t n : {int64_t{7}, int64_t{65537}, int64_t{300001}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " n " + std::to_string(n));
      at::manual_seed(1000 + g.rank());
      auto mine = at::randn({n * N}).to(dt);
      for (auto rop : {ReduceOp::Sum, ReduceOp::Avg})
        for (bool widen : {false, true}) {
          if (widen && dt == at::kFloat) continue;
          auto rs = [&] {
            auto out = at::empty({n}, widen ? at::kFloat : dt);
            comm.reduce_scatter(g, out, mine, rop)->wait();
            return out;
          };
          EXPECT_TRUE(run(true, rs).equal(run(false, rs))) << "reduce_scatter";
        }
      for (auto rop : {ReduceOp::Sum, ReduceOp::Avg}) {
        auto ar = [&] {
          auto t = mine.narrow(0, 0, n).clone();
          comm.all_reduce(g, t, rop)->wait();
          return t;
        };
        auto shm = run(true, ar), gloo = run(false, ar);
        // Gloo's ring adds N > 2 values in its own order; with two, a + b = b + a.
        if (N == 2) EXPECT_TRUE(shm.equal(gloo)) << "all_reduce";
        else EXPECT_TRUE(at::allclose(shm.to(at::kFloat), gloo.to(at::kFloat), 1e-2, 1e-5)) << "all_reduce";
        // Every rank holds the same bits (each sums all copies in rank order).
        auto all = at::empty({n * N}, dt);
        comm.all_gather(g, all, shm)->wait();
        for (int r = 1; r < N; ++r) EXPECT_TRUE(all.narrow(0, r * n, n).equal(all.narrow(0, 0, n)));
      }
    }
}

TEST(BadArguments, NameTheOpAndGroup) {
  auto& comm = world().comm();
  const Group& g = world().group();
  auto expect_msg = [](auto&& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("group 'world'"), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { comm.all_gather(g, at::empty({3}), at::empty({2})); }, "allgather");
  expect_msg([&] { comm.reduce_scatter(g, at::empty({2}), at::empty({2 * g.size() + 1})); }, "reduce_scatter");
  expect_msg([&] { comm.reduce_scatter(g, at::empty({2}, at::kHalf), at::empty({2 * g.size()})); }, "dtype");
  expect_msg([&] { comm.broadcast(g, at::empty({2}), g.size()); }, "root");
  expect_msg([&] { comm.all_reduce(g, at::empty({4, 4}).t()); }, "contiguous");
}

// Ranks that disagree on a collective -- its size, dtype, op or label --
// fail on every rank at once, naming the op, the group and both sides,
// before any data moves (a size mismatch used to pair rounds by count on
// the fast path and return a wrong sum). A failed shared-memory lane stays
// failed, so each case runs on a fresh group.
TEST(Disagreement, IsAnErrorOnEveryRankNamingBothSides) {
  auto& w = world();
  const bool odd = w.rank() == w.size() - 1;  // the rank that disagrees
  int fresh = 0;
  struct Case {
    const char* name;
    std::function<void(zero::comm::Comm&, const Group&)> run;
    std::vector<std::string> expect;  // parts of the message
  };
  const std::vector<Case> cases = {
      {"size",
       [&](auto& comm, const Group& g) { comm.all_reduce(g, at::ones({odd ? 100 : 200}))->wait(); },
       {"all_reduce", "of 200 Float", "of 100 Float"}},
      {"dtype",
       [&](auto& comm, const Group& g) {
         auto dt = odd ? at::kBFloat16 : at::kFloat;
         comm.all_gather(g, at::empty({8 * g.size()}, dt), at::zeros({8}, dt))->wait();
       },
       {"allgather", "BFloat16", "Float"}},
      {"op",
       [&](auto& comm, const Group& g) {
         auto t = at::ones({64});
         if (odd) comm.broadcast(g, t, 0)->wait();
         else comm.all_reduce(g, t)->wait();
       },
       {"broadcast of 64", "all_reduce of 64"}},
      {"label",
       [&](auto& comm, const Group& g) {
         comm.all_gather(g, at::empty({4 * g.size()}), at::zeros({4}), odd ? "params of unit 'b'" : "params of unit 'a'")
             ->wait();
       },
       {"unit 'a'", "unit 'b'"}},
      {"empty against non-empty",
       [&](auto& comm, const Group& g) { comm.all_reduce(g, at::ones({odd ? 0 : 5}))->wait(); },
       {"of 5 Float", "of 0 Float"}},
  };
  for (const char* transport : {"shm", "gloo"})
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(transport) + ": " + c.name);
      auto g = every_rank_group("disagree" + std::to_string(fresh++));
      w.comm().set_fast_paths_enabled(std::string(transport) == "shm");
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.run(w.comm(), *g);
        ADD_FAILURE() << "no error";
      } catch (const CommError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("disagree"), std::string::npos) << msg;
        EXPECT_NE(msg.find(g->describe()), std::string::npos) << msg;
        for (const auto& part : c.expect) EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
      }
      // Named at once, not after the collective timeout (300 s); the bound
      // leaves a loaded machine room (a liveness bound, not a timing).
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
      w.comm().set_fast_paths_enabled(true);
    }
  w.comm().barrier(w.group())->wait();
}

// Collectives that ranks issued to the group's different lanes -- the last
// rank a reduce-scatter (its next backward) where the others run an
// allgather (a state dict called on them alone) -- never meet in a round to
// compare signatures. Shared memory finds the stall within seconds, on
// every rank, naming what each waits in; not at the collective timeout
// (300 s). (Gloo's lanes still wait for the timeout: comm_timeout.)
TEST(Disagreement, CollectivesOnDifferentLanesAreNamedNotAHang) {
  auto& w = world();
  auto g = every_rank_group("lanes apart");
  const bool odd = w.rank() == w.size() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (odd)
      w.comm().reduce_scatter(*g, at::zeros({8}), at::ones({8 * g->size()}), zero::comm::ReduceOp::Sum,
                              "grads of unit 'h0'")->wait();
    else
      w.comm().all_gather(*g, at::empty({4 * g->size()}), at::zeros({4}), "params for state_dict")->wait();
    ADD_FAILURE() << "no error";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deadlocked"), std::string::npos) << msg;
    EXPECT_NE(msg.find(g->describe()), std::string::npos) << msg;
    EXPECT_NE(msg.find("grads of unit 'h0'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("params for state_dict"), std::string::npos) << msg;
  }
  // A liveness bound with room for a loaded machine, far below the timeout.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  w.comm().barrier(w.group())->wait();
}

// The negative case: a rank whose other thread, one that has issued
// collectives to the group before, is still computing when the stall
// detection looks may yet issue the collective its peer waits for. Ranks
// waiting across the lanes meanwhile are not a deadlock: both collectives
// complete, with no error.
TEST(Disagreement, CrossLaneWaitsWithAnotherSubmittingThreadStillBusyAreNotAStall) {
  auto& w = world();
  auto g = every_rank_group("lanes apart, threads");
  auto& comm = w.comm();
  const bool odd = w.rank() == w.size() - 1;
  auto gather = [&] { comm.all_gather(*g, at::empty({4 * g->size()}), at::ones({4}), "gather")->wait(); };
  auto scatter = [&] { comm.reduce_scatter(*g, at::zeros({8}), at::ones({8 * g->size()}), zero::comm::ReduceOp::Sum,
                                           "scatter")->wait(); };
  // Both threads of every rank have issued a collective to the group.
  comm.all_reduce(*g, at::ones({1}), zero::comm::ReduceOp::Sum, "main thread")->wait();
  std::thread([&] { comm.all_reduce(*g, at::ones({1}), zero::comm::ReduceOp::Sum, "other thread")->wait(); }).join();
  // The last rank's main thread waits in the reduce-scatter, the others' in
  // the allgather; each rank's other thread issues its other collective
  // after the detection has looked (2 s in, three looks).
  std::string error;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
    try {
      odd ? gather() : scatter();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  try {
    odd ? scatter() : gather();
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  later.join();
  EXPECT_EQ(error, "");
  comm.barrier(w.group())->wait();
}

// NCCL checks nothing itself: in debug mode (TORCH_DISTRIBUTED_DEBUG=DETAIL)
// each of its collectives is first compared on the group's Gloo lane of
// the same kind. That check, here on its own: ranks that agree pass; ranks
// that disagree fail on every rank at once, naming both sides; a
// reduce-scatter's check rides the reduce lane, so it neither waits for nor
// pairs with the main lane's.
TEST(DeviceSignatureCheck, RanksThatDisagreeFailOnEveryRankNamingBoth) {
  auto& w = world();
  auto g = every_rank_group("device_signatures");
  const auto ag = zero::comm::CollectiveOp::AllGather, rs = zero::comm::CollectiveOp::ReduceScatter;
  zero::comm::check_signature_on_host(*g, ag, {"allgather of 64 BFloat16 [params of unit 'h0']"});
  // Different orders on the two lanes: rank 0 checks the reduce-scatter
  // first, the others the allgather; each lane still pairs its own.
  auto both = [&](bool reduce_first) {
    std::thread other([&] {
      zero::comm::check_signature_on_host(*g, reduce_first ? ag : rs,
                                          {reduce_first ? "allgather of 8 Float" : "reduce_scatter of 8 Float"});
    });
    zero::comm::check_signature_on_host(*g, reduce_first ? rs : ag,
                                        {reduce_first ? "reduce_scatter of 8 Float" : "allgather of 8 Float"});
    other.join();
  };
  both(w.rank() == 0);
  const bool odd = w.rank() == w.size() - 1;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    zero::comm::check_signature_on_host(*g, ag, {odd ? "allgather of 100 Float" : "allgather of 200 Float"});
    ADD_FAILURE() << "no error";
  } catch (const zero::comm::CollectiveMismatch& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("of 100 Float"), std::string::npos) << msg;
    EXPECT_NE(msg.find("of 200 Float"), std::string::npos) << msg;
    EXPECT_NE(msg.find(g->describe()), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  w.comm().barrier(w.group())->wait();
}

TEST(Collectives, BroadcastCoalescedOnePerDtype) {
  for_each_transport([&] {
    auto& comm = world().comm();
    const Group& g = world().group();
    const int r = g.rank();
    std::vector<at::Tensor> ts = {at::full({3, 4}, r + 1.0), at::full({5}, static_cast<int64_t>(r + 7), at::kLong),
                                  at::full({2}, r + 2.0), at::full({4, 2}, r + 3.0).t(), at::empty({0})};
    const auto before = comm.counters().totals();
    comm.broadcast_coalesced(g, ts, g.size() - 1, "buffers");
    const auto d = zero::comm::diff(comm.counters().totals(), before);
    EXPECT_EQ(d.at("broadcast").calls, 2);  // Float and Long
    const int root = g.size() - 1;
    EXPECT_TRUE(ts[0].eq(root + 1.0).all().item<bool>());
    EXPECT_TRUE(ts[1].eq(root + 7).all().item<bool>());
    EXPECT_TRUE(ts[2].eq(root + 2.0).all().item<bool>());
    EXPECT_TRUE(ts[3].eq(root + 3.0).all().item<bool>());  // a non-contiguous view is written through
  });
}

// Rank 0 waits in a collective the others never join; it must fail naming
// the op and group on time, not hang.
void expect_unmatched_collective_times_out() {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (g.rank() == 0) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(g, at::ones({8}))->wait();
      ADD_FAILURE() << "all_reduce completed without its peers";
    } catch (const CommError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("all_reduce on group 'world'"), std::string::npos) << msg;
      auto s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 10.0);
      std::printf("timed out as expected after %.1f s: %s\n", s, msg.c_str());
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(6));
  }
}

// Run alone with ZERO_COLLECTIVE_TIMEOUT_S=2, on each transport.
TEST(Timeout, UnmatchedCollectiveFailsOnTime) {
  for_each_transport([] { expect_unmatched_collective_times_out(); });
}

// Run alone by tests/scripts/shm_test.sh, with ranks started by hand (no
// zero-run to stop the others): the last rank dies by SIGKILL while the
// others wait for it in a collective; they must fail naming it within about
// a second, long before the collective timeout. With ZERO_TEST_SHARED_BUFFER=1
// the tensor is a shared flat buffer: the zero-copy path (lane.h).
TEST(ShmKill, PeerKilledMidCollective) {
  auto& comm = world().comm();
  const Group& g = world().group();
  const char* shared = std::getenv("ZERO_TEST_SHARED_BUFFER");
  const bool zero_copy = shared && std::string(shared) == "1";
  auto t = zero_copy ? zero::memory::flat_copy_of(at::ones({1 << 20})) : at::ones({1 << 20});
  const int64_t before = zero::comm::shm_zero_copy_collectives(g);
  comm.all_reduce(g, t)->wait();  // everyone is up and on the fast path
  ASSERT_EQ(zero::comm::shm_zero_copy_collectives(g) - before, zero_copy ? 1 : 0);
  if (g.rank() == g.size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    raise(SIGKILL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm.all_reduce(g, t)->wait();
    ADD_FAILURE() << "all_reduce completed without the killed rank";
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("failed as expected after %.2f s: %s\n", s, e.what());
    EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
    EXPECT_LT(s, 5.0);
  }
}

}  // namespace

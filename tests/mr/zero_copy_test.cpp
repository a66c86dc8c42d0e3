// Zero-copy collectives (comm/shm/lane.h): inputs in the engine's shared flat
// buffers (memory::zeros_flat) are read by the peers in place. Checked
// against the staged shared-memory path on ordinary tensors, bit for bit,
// with the zero-copy count as the oracle of which path ran; ranks that
// disagree about it, sub-groups, buffers reused or freed right after a
// collective, and the memory a peer's freed buffer leaves behind. Runs at
// 2, 3 and 4 ranks (the comm_* ctest entries); ShmUnwind.* alone (below).
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "comm/shm/lane.h"
#include "comm/shm_transport.h"
#include "memory/page_buffer.h"

#include "mr.h"

namespace {

using zero::comm::CommError;
using zero::comm::Group;
using zero::comm::ReduceOp;
using zero::comm::shm_zero_copy;
using zero::comm::shm_zero_copy_collectives;
using zero::memory::flat_copy_of;
using zero::test::world;

const at::ScalarType kDTypes[] = {at::kFloat, at::kHalf, at::kBFloat16};
// Sizes that do and do not divide by 2, 3 and 4, past several staged rounds.
const int64_t kSizes[] = {1, 7, 1000, 65537, 300001};

at::Tensor random_data(int64_t n, at::ScalarType dt, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn({n}).to(dt);
}

// Runs `op` on the group and returns how many of its collectives ran zero-copy.
template <typename F>
int64_t zero_copy_count(const Group& g, F&& op) {
  const int64_t before = shm_zero_copy_collectives(g);
  op();
  return shm_zero_copy_collectives(g) - before;
}

// Each op twice: on shared buffers (zero-copy) and on ordinary ones (staged).
void expect_bit_identical_to_staged(const Group& g) {
  auto& comm = world().comm();
  const int N = g.size(), me = g.rank();
  for (auto dt : kDTypes)
    for (int64_t n : kSizes) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " n " + std::to_string(n));
      const at::Tensor mine = random_data(n * N, dt, 1000 + 7 * n + me);
      const at::Tensor shared = flat_copy_of(mine);

      // allgather: a separate shard, an in-place one, and 16-bit into fp32.
      {
        auto staged = at::empty({n * N}, dt), direct = at::empty({n * N}, dt);
        const at::Tensor shard = mine.narrow(0, me * n, n).clone();
        EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, staged, shard)->wait(); }), 0);
        EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, direct, flat_copy_of(shard))->wait(); }), 1);
        EXPECT_TRUE(direct.equal(staged)) << "allgather";

        at::Tensor in_place = flat_copy_of(at::zeros({n * N}, dt));
        in_place.narrow(0, me * n, n).copy_(shard);
        EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, in_place, in_place.narrow(0, me * n, n))->wait(); }),
                  1);
        EXPECT_TRUE(in_place.equal(staged)) << "allgather in place";

        if (dt != at::kFloat) {
          auto wide_staged = at::empty({n * N}, at::kFloat), wide = at::empty({n * N}, at::kFloat);
          comm.all_gather(g, wide_staged, shard)->wait();
          EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, wide, flat_copy_of(shard))->wait(); }), 1);
          EXPECT_TRUE(wide.equal(wide_staged)) << "allgather widening";
        }
      }
      // reduce-scatter: sum and average, 16-bit into fp32, and into this
      // rank's own slice of the input (as the engine's fp32 grads do).
      for (auto op : {ReduceOp::Sum, ReduceOp::Avg})
        for (bool widen : {false, true}) {
          if (widen && dt == at::kFloat) continue;
          const at::ScalarType out_dt = widen ? at::kFloat : dt;
          auto staged = at::empty({n}, out_dt), direct = at::empty({n}, out_dt);
          EXPECT_EQ(zero_copy_count(g, [&] { comm.reduce_scatter(g, staged, mine, op)->wait(); }), 0);
          EXPECT_EQ(zero_copy_count(g, [&] { comm.reduce_scatter(g, direct, shared, op)->wait(); }), 1);
          EXPECT_TRUE(direct.equal(staged)) << "reduce_scatter" << (widen ? " widening" : "");
          if (!widen) {
            at::Tensor grads = flat_copy_of(mine);
            at::Tensor own = grads.narrow(0, me * n, n);
            EXPECT_EQ(zero_copy_count(g, [&] { comm.reduce_scatter(g, own, grads, op)->wait(); }), 1);
            EXPECT_TRUE(own.equal(staged)) << "reduce_scatter into its own slice";
          }
        }
      // all-reduce, on sizes that do not split evenly into slices.
      for (auto op : {ReduceOp::Sum, ReduceOp::Avg}) {
        auto staged = mine.narrow(0, 0, n).clone();
        auto direct = flat_copy_of(staged);
        EXPECT_EQ(zero_copy_count(g, [&] { comm.all_reduce(g, staged, op)->wait(); }), 0);
        EXPECT_EQ(zero_copy_count(g, [&] { comm.all_reduce(g, direct, op)->wait(); }), 1);
        EXPECT_TRUE(direct.equal(staged)) << "all_reduce";
      }
    }
}

TEST(ZeroCopy, AgreedAtSetupForTheWorld) {
  if (const char* v = std::getenv("ZERO_COMM_ZERO_COPY"); v && std::string(v) == "off") {
    EXPECT_FALSE(shm_zero_copy(world().group()));
    GTEST_SKIP() << "ZERO_COMM_ZERO_COPY=off";
  }
  EXPECT_TRUE(shm_zero_copy(world().group()));
}

TEST(ZeroCopy, BitIdenticalToTheStagedPath) {
  if (!shm_zero_copy(world().group())) GTEST_SKIP() << "no zero-copy here";
  expect_bit_identical_to_staged(world().group());
}

// A group that is a strict subset of the world: its own segment, its own
// buffers' peers.
TEST(ZeroCopy, StrictSubGroup) {
  auto& w = world();
  if (w.size() < 3) GTEST_SKIP() << "needs 3+ ranks";
  std::vector<int> members;
  for (int r = 1; r < w.size(); ++r) members.push_back(r);  // all but rank 0
  auto g = w.new_group(members, "all_but_0");
  if (g) {
    ASSERT_TRUE(shm_zero_copy(*g));
    expect_bit_identical_to_staged(*g);
  }
  w.comm().barrier(w.group())->wait();
}

// One rank's input is an ordinary tensor: every rank takes the staged path
// (they decide together), and the result is still right.
TEST(ZeroCopy, OneRankWithoutASharedBufferStagesForAll) {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (!shm_zero_copy(g)) GTEST_SKIP() << "no zero-copy here";
  const int64_t n = 4099;
  const at::Tensor mine = at::full({n}, g.rank() + 1.0, at::kFloat);
  const at::Tensor t = g.rank() == 0 ? mine.clone() : flat_copy_of(mine);
  EXPECT_EQ(zero_copy_count(g, [&] { comm.all_reduce(g, t)->wait(); }), 0);
  EXPECT_TRUE(t.eq(g.size() * (g.size() + 1) / 2.0).all().item<bool>());
}

// The input is overwritten as soon as the collective returns, hundreds of
// times: a peer still reading it would see the next values (the collective
// must end only when every peer is done with every buffer).
TEST(ZeroCopy, InputsReusedTheMomentACollectiveReturns) {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (!shm_zero_copy(g)) GTEST_SKIP() << "no zero-copy here";
  const int N = g.size();
  const int64_t n = 20000;
  at::Tensor flat = flat_copy_of(at::zeros({n * N}));
  at::Tensor shard = flat.narrow(0, g.rank() * n, n);
  at::Tensor out = at::empty({n});
  for (int i = 0; i < 300; ++i) {
    shard.fill_(i * 10 + g.rank());
    comm.all_gather(g, flat, shard)->wait();
    for (int r = 0; r < N; ++r) ASSERT_EQ(flat[r * n + n - 1].item<float>(), i * 10 + r) << "iteration " << i;
    comm.reduce_scatter(g, out, flat)->wait();  // every rank's flat is the same gather
    ASSERT_EQ(out[0].item<float>(), N * (i * 10 + g.rank())) << "iteration " << i;
    flat.fill_(-1);  // at once: a peer still reading would sum it
  }
}

int64_t rss_shmem_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t value = 0;
  while (status >> key) {
    if (key == "RssShmem:") {
      status >> value;
      return value;
    }
    status.ignore(1 << 12, '\n');
  }
  return -1;
}

// A buffer made, gathered from and freed every step (as the grad buffers of
// some stages are): the peers' mappings of freed buffers must not keep
// their pages, nor pile up.
TEST(ZeroCopy, FreedBuffersLeaveNothingMappedBehind) {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (!shm_zero_copy(g)) GTEST_SKIP() << "no zero-copy here";
  const int N = g.size();
  const int64_t n = (8 << 20) / 4 / N;  // 8 MiB gathered
  at::Tensor out = at::empty({n * N});
  comm.all_gather(g, out, flat_copy_of(at::ones({n})))->wait();  // warm
  const int64_t before = rss_shmem_kib();
  for (int i = 0; i < 100; ++i) {
    at::Tensor shard = flat_copy_of(at::full({n}, static_cast<double>(i)));
    EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, out, shard)->wait(); }), 1);
    ASSERT_EQ(out[n * N - 1].item<float>(), i);
  }
  comm.barrier(g)->wait();  // every rank has freed its last shard
  // 100 steps x (N-1) peers' 8/N MiB: 800 MiB if kept; at most a few here.
  EXPECT_LT(rss_shmem_kib() - before, 4 * (8 << 10)) << "KiB of shared pages still mapped";
}

// Buffers that live on (as the engine's param shards and grad buffers do),
// read by every collective kind: once a collective returns, the reader's
// view of the peers' pages is gone from its RSS (they are the peers'
// memory, counted in theirs), and the next read faults the peers' current
// values back in.
TEST(ZeroCopy, LiveBuffersReadLeaveNoPeerPagesInTheReadersRss) {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (!shm_zero_copy(g)) GTEST_SKIP() << "no zero-copy here";
  const int N = g.size(), me = g.rank();
  const int64_t n = (32 << 20) / 4 / N;  // 32 MiB gathered, reduced and all-reduced
  at::Tensor shard = flat_copy_of(at::zeros({n}));
  at::Tensor full = flat_copy_of(at::zeros({n * N}));
  at::Tensor summed = flat_copy_of(at::zeros({n * N}));
  at::Tensor gathered = at::empty({n * N}), reduced = at::empty({n});
  const int64_t mine_kib = rss_shmem_kib();  // this rank's own buffers, all resident
  for (int i = 1; i <= 3; ++i) {
    shard.fill_(i * 10 + me);
    full.fill_(i + me);
    summed.fill_(i * 100 + me);
    EXPECT_EQ(zero_copy_count(g, [&] { comm.all_gather(g, gathered, shard)->wait(); }), 1);
    EXPECT_EQ(zero_copy_count(g, [&] { comm.reduce_scatter(g, reduced, full)->wait(); }), 1);
    EXPECT_EQ(zero_copy_count(g, [&] { comm.all_reduce(g, summed)->wait(); }), 1);
    for (int r = 0; r < N; ++r) ASSERT_EQ(gathered[r * n + n - 1].item<float>(), i * 10 + r) << "iteration " << i;
    ASSERT_EQ(reduced[n - 1].item<float>(), N * i + N * (N - 1) / 2) << "iteration " << i;
    ASSERT_EQ(summed[n * N - 1].item<float>(), N * i * 100 + N * (N - 1) / 2) << "iteration " << i;
    // Kept mapped, the peers' pages read here would be at least 48 MiB:
    // (N-1)/N of 32 MiB from the gather and each peer's whole all-reduced
    // buffer (its slice of the sum, then the others' summed slices).
    EXPECT_LT(rss_shmem_kib() - mine_kib, 2 << 10) << "KiB of the peers' pages still in this rank's RSS, iteration " << i;
    comm.barrier(g)->wait();  // every rank has checked before any refills
  }
}

// Run alone (ctest zero_copy_unwind; it ends the world): the last rank
// throws while its peers are in the middle of reading its buffer in a large
// zero-copy allgather, and its world is shut down as the exception unwinds
// (as a program's World going out of scope would), failing the collective
// and dropping the last handles on the buffer. The readers, held after
// mapping its buffer (Lane::delay_peer_reads_for_testing), must then read
// what it published -- its pages stay while a peer may read them -- and
// fail with an error naming it, not die of SIGBUS.
TEST(ShmUnwind, PeerThrowsMidZeroCopyAllGather) {
  auto& comm = world().comm();
  const Group& g = world().group();
  if (!shm_zero_copy(g)) GTEST_SKIP() << "no zero-copy here";
  const int N = g.size(), me = g.rank(), failing = N - 1;
  const int64_t n = (16 << 20) / 4;  // 16 MiB per rank
  comm.all_gather(g, at::empty({n * N}), flat_copy_of(at::ones({n})))->wait();  // every rank is up
  if (me == failing) {
    try {
      at::Tensor shard = flat_copy_of(at::full({n}, static_cast<double>(me + 1)));
      at::Tensor out = at::empty({n * N});
      auto work = comm.all_gather(g, out, shard);
      // Its own part is done long before its peers' reads resume.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      throw std::runtime_error("a failure in the middle of the allgather");
    } catch (const std::runtime_error&) {
      world().shutdown();
    }
    return;
  }
  zero::comm::shm_lane(g, zero::comm::CollectiveOp::AllGather)
      ->delay_peer_reads_for_testing(std::chrono::milliseconds(2000));
  at::Tensor out = at::empty({n * N});
  try {
    comm.all_gather(g, out, flat_copy_of(at::full({n}, static_cast<double>(me + 1))))->wait();
    // The failing rank had finished its part: the gather may complete, with its data.
    EXPECT_EQ(out.narrow(0, failing * n, n).eq(failing + 1).all().item<bool>(), true);
    comm.all_reduce(g, at::ones({4}))->wait();
    ADD_FAILURE() << "a collective completed without the failed rank";
  } catch (const CommError& e) {
    std::printf("failed as expected: %s\n", e.what());
    const std::string what = e.what(), named = "rank " + std::to_string(failing);
    const size_t at = what.find(named);
    EXPECT_TRUE(at != std::string::npos && !std::isdigit(static_cast<unsigned char>(what[at + named.size()])))
        << what;
  }
}

}  // namespace

// DistributedSampler, with N ranks simulated in one process: each epoch's
// samples are read exactly once across the ranks (or padded / dropped as
// documented), the order is the same on every rank and differs by epoch
// and seed, and a resumed sampler reads exactly what the uninterrupted one
// would have -- also at another world size.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "zero/sampler.h"

namespace {

using zero::DistributedSampler;

std::vector<std::vector<int64_t>> all_ranks(int64_t size, int n, int64_t epoch, DistributedSampler::Options o) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < n; ++r) {
    DistributedSampler s(size, n, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    EXPECT_EQ(static_cast<int64_t>(out.back().size()), s.samples_per_rank());
  }
  return out;
}

std::map<int64_t, int> counts(const std::vector<std::vector<int64_t>>& ranks) {
  std::map<int64_t, int> c;
  for (const auto& r : ranks)
    for (int64_t i : r) ++c[i];
  return c;
}

TEST(DistributedSampler, EverySampleExactlyOncePerEpochAcrossRanks) {
  for (int n : {1, 2, 3, 4})
    for (bool shuffle : {true, false})
      for (int64_t epoch : {0, 1, 7}) {
        const int64_t size = 12 * 5;  // divisible by every n here
        const auto ranks = all_ranks(size, n, epoch, {shuffle, 42, false});
        const auto c = counts(ranks);
        ASSERT_EQ(static_cast<int64_t>(c.size()), size) << n << " ranks";
        for (const auto& [i, k] : c) {
          EXPECT_EQ(k, 1) << "sample " << i;
          EXPECT_TRUE(i >= 0 && i < size);
        }
      }
}

TEST(DistributedSampler, UnevenSizesPadOrDropAndRanksStayInStep) {
  const int64_t size = 23;
  const int n = 4;
  const auto padded = all_ranks(size, n, 0, {true, 1, false});
  for (const auto& r : padded) EXPECT_EQ(r.size(), 6u);  // ceil(23 / 4)
  const auto cp = counts(padded);
  EXPECT_EQ(static_cast<int64_t>(cp.size()), size);  // every sample read
  int extra = 0;
  for (const auto& [i, k] : cp) extra += k - 1;
  EXPECT_EQ(extra, 1);  // 24 slots, 23 samples: one read twice
  const auto dropped = all_ranks(size, n, 0, {true, 1, true});
  for (const auto& r : dropped) EXPECT_EQ(r.size(), 5u);
  const auto cd = counts(dropped);
  EXPECT_EQ(cd.size(), 20u);
  for (const auto& [i, k] : cd) EXPECT_EQ(k, 1);
}

TEST(DistributedSampler, DeterministicPerEpochAndSeed) {
  const auto a = all_ranks(100, 2, 3, {true, 9, false});
  EXPECT_EQ(a, all_ranks(100, 2, 3, {true, 9, false}));
  EXPECT_NE(a, all_ranks(100, 2, 4, {true, 9, false})) << "another epoch, another order";
  EXPECT_NE(a, all_ranks(100, 2, 3, {true, 10, false})) << "another seed, another order";
  const auto in_order = all_ranks(10, 2, 0, {false, 0, false});
  EXPECT_EQ(in_order[0], (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(in_order[1], (std::vector<int64_t>{1, 3, 5, 7, 9}));
}

TEST(DistributedSampler, ResumesWhereItStoppedAtAnyWorldSize) {
  const int64_t size = 96;
  const DistributedSampler::Options o{true, 5, false};
  // The global order of epoch 2, read by 4 ranks interleaved.
  auto four = all_ranks(size, 4, 2, o);
  std::vector<int64_t> global(size);
  for (int r = 0; r < 4; ++r)
    for (size_t k = 0; k < four[r].size(); ++k) global[k * 4 + r] = four[r][k];
  // 40 samples read, saved, resumed by 4 ranks and by 2.
  DistributedSampler saver(size, 4, 0, o);
  saver.set_epoch(2);
  const auto state = saver.state(40);
  for (int n : {4, 2}) {
    for (int r = 0; r < n; ++r) {
      DistributedSampler s(size, n, r, o);
      s.load_state(state);
      EXPECT_EQ(s.epoch(), 2);
      std::vector<int64_t> want;
      for (int64_t p = 40 + r; p < size; p += n) want.push_back(global[p]);
      EXPECT_EQ(s.indices(), want) << n << " ranks, rank " << r;
    }
  }
  // A position that is not a whole round of 3 ranks rounds down.
  DistributedSampler three(size, 3, 1, o);
  three.load_state(state);
  EXPECT_EQ(three.indices().front(), global[39 + 1]);
  // Another dataset or seed is refused, naming both.
  DistributedSampler other(size + 1, 4, 0, o);
  try {
    other.load_state(state);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dataset_size 97"), std::string::npos) << e.what();
  }
}

TEST(DistributedSampler, BadArgumentsAreNamed) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(3, 4, 0, {true, 0, true}), std::invalid_argument);
}

}  // namespace

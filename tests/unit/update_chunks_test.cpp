// The ZeRO-Offload pipeline's chunking (engine/update_chunks.h): every
// element of every span is updated exactly once, inside its chunk, with its
// span's hypers, and the chunks tile the master.
#include "engine/update_chunks.h"

#include <gtest/gtest.h>

namespace {

using zero::cut_into_chunks;
using zero::UpdateSpan;

// hyper of each element after running the pieces (-1: not updated; -2: twice).
std::vector<int> coverage(const std::vector<zero::UpdateChunk>& chunks, int64_t numel) {
  std::vector<int> seen(numel, -1);
  for (const auto& c : chunks)
    for (const auto& p : c.pieces) {
      EXPECT_GE(p.begin, c.begin);
      EXPECT_LE(p.begin + p.numel, c.begin + c.numel);
      EXPECT_GT(p.numel, 0);
      for (int64_t i = p.begin; i < p.begin + p.numel; ++i) seen[i] = seen[i] == -1 ? p.hyper : -2;
    }
  return seen;
}

TEST(UpdateChunks, PiecesCoverEverySpanOnceAtEveryChunkSize) {
  // Three param groups' runs, one ending exactly on a chunk boundary of 8, one gap.
  const std::vector<UpdateSpan> spans{{0, 8, 0}, {8, 5, 2}, {13, 9, 1}, {25, 6, 0}};
  const int64_t numel = 31;
  std::vector<int> want(numel, -1);
  for (const auto& s : spans)
    for (int64_t i = s.begin; i < s.begin + s.numel; ++i) want[i] = s.hyper;
  for (int64_t chunk : {1, 3, 7, 8, 30, 31, 32, 1000}) {
    const auto chunks = cut_into_chunks(spans, numel, chunk);
    ASSERT_EQ(static_cast<int64_t>(chunks.size()), (numel + chunk - 1) / chunk) << chunk;
    int64_t next = 0;
    for (const auto& c : chunks) {
      EXPECT_EQ(c.begin, next);
      EXPECT_LE(c.numel, chunk);
      next = c.begin + c.numel;
    }
    EXPECT_EQ(next, numel);
    EXPECT_EQ(coverage(chunks, numel), want) << "chunk " << chunk;
  }
}

TEST(UpdateChunks, NoChunkSizeIsOneChunkAndNoElementsNoChunks) {
  const std::vector<UpdateSpan> spans{{0, 10, 0}};
  const auto one = cut_into_chunks(spans, 10, 0);
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].pieces.size(), 1u);
  EXPECT_EQ(one[0].pieces[0].numel, 10);
  EXPECT_TRUE(cut_into_chunks({}, 0, 4).empty());
}

}  // namespace

// The ZeRO-Offload step's pipeline granularity (engine/flat_optimizer.cpp).
// With the master on the host and the grads on a device, a group's update
// runs chunk by chunk: chunk k's grads come down while chunk k-1 is updated
// on the CPU and chunk k-2's new params go up. The update runs over spans
// (runs of the master under one param group's hypers); this cuts them at
// the chunk boundaries. The fused kernels are elementwise, so the chunked
// update is the unchunked one bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace zero {

struct UpdateSpan {
  int64_t begin, numel;  // elements of the master (this rank's shard, or all of it)
  int hyper;             // index into the optimizer's param-group hypers
};

struct UpdateChunk {
  int64_t begin, numel;             // the chunk: [begin, begin + numel) of the master
  std::vector<UpdateSpan> pieces;   // the spans' parts inside it, in order
};

// Chunks of `chunk` elements (the last shorter) covering [0, numel); every
// element of a span lands in exactly one piece. Elements in no span (there
// are none today: spans cover the master) are copied but not updated.
inline std::vector<UpdateChunk> cut_into_chunks(const std::vector<UpdateSpan>& spans, int64_t numel, int64_t chunk) {
  std::vector<UpdateChunk> out;
  if (chunk <= 0) chunk = std::max<int64_t>(numel, 1);
  for (int64_t c0 = 0; c0 < numel; c0 += chunk) {
    const int64_t c1 = std::min(numel, c0 + chunk);
    UpdateChunk c{c0, c1 - c0, {}};
    for (const auto& s : spans) {
      const int64_t b = std::max(s.begin, c0), e = std::min(s.begin + s.numel, c1);
      if (b < e) c.pieces.push_back({b, e - b, s.hyper});
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace zero

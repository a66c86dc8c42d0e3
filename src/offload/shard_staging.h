// ZeRO-Infinity's param offload on a device model (offload_param "nvme"
// with pin_memory, the default): a swapped shard goes up to the device
// disk -> pinned host buffer (direct I/O) -> device (an asynchronous copy
// on the caller's stream), as DeepSpeed's partitioned-param swapper feeds
// its gathers, never through the shard's own pageable host memory (whose
// copy to a device the host would wait for, the driver staging it).
//
// A pool of pinned buffers (offload_param.buffer_count of them, each the
// size of the largest shard), each in one of three states:
//
//   Free --stage(slot)--> Reading --upload--> Uploading --its copy done--> Free
//     ^                      |
//     +-------drop(slot)-----+   (the host needs the shard itself: the read is waited for)
//
// Read ahead (stage) takes only a Free buffer; upload takes one even when
// none is Free -- waiting for a buffer's copy up, or dropping another
// slot's staged read.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include "io/aio_engine.h"

namespace zero::offload {

class StateSwapper;

class ShardStaging {
 public:
  ShardStaging(StateSwapper& swapper, int64_t buffers);
  ShardStaging(const ShardStaging&) = delete;
  ShardStaging& operator=(const ShardStaging&) = delete;
  ~ShardStaging();  // waits for the reads in flight: they write into the buffers

  // Starts reading `slot`'s disk copy into a Free buffer. Nothing (false)
  // when it is staged already, no buffer is Free, or the slot is not on
  // disk alone (in memory, or on its way in or out).
  bool stage(int slot);
  // The slot's shard on `device` (`numel` elements of `dtype`), queued up
  // from its pinned buffer on the device's current stream -- staged now if
  // it was not. nullopt where the slot is not on disk alone: the caller
  // then pages it into host memory (StateSwapper::acquire).
  std::optional<at::Tensor> upload(int slot, at::ScalarType dtype, int64_t numel, at::Device device);
  // Forgets the slot's staged copy, its read waited for (its failure
  // dropped): before the host acquires the slot (a write-back after it
  // would rewrite what is read).
  void drop(int slot);
  // The largest shard, in bytes: each buffer is made this size once.
  void reserve(int64_t bytes);

  int64_t busy() const;  // buffers not Free (Reading, or their copy up not done)

 private:
  struct Buffer {
    at::Tensor pinned;  // uint8, kAlignment spare for the aligned start
    int slot = -1;      // Reading for this slot; -1 otherwise
    io::AioEngine::Ticket ticket = 0;
    std::optional<c10::Event> uploading;  // the copy up, until it is done
  };
  static bool free(const Buffer& b);
  Buffer* find(int slot);
  // A Free buffer; with `take_any`, one made Free (the oldest copy up
  // waited for, else another slot's read dropped); else nullptr.
  Buffer* free_buffer(bool take_any);
  // The buffer's aligned start, reallocated (pinned) if under `bytes`.
  at::Tensor region(Buffer& b, int64_t bytes);
  void wait_read(Buffer& b);  // the buffer Free again; throws the read's failure
  void discard_read(Buffer& b) noexcept;  // the same, its failure dropped

  StateSwapper& swapper_;
  std::vector<Buffer> buffers_;
  int64_t largest_ = 0;
};

}  // namespace zero::offload

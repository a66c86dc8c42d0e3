// ZeRO-Infinity's param offload (offload_param.device "nvme"): stage 3's
// param shards -- each rank's part of each unit, in the storage dtype -- in
// a swap file, in memory only while they are used:
//   - a gather reads them: the shard is read in before the unit's
//     all-gather and its pages released once the all-gather is done (a
//     zero-copy collective completes only when every peer has finished
//     reading it in place: comm/shm/lane.h);
//   - the optimizer step writes them (the fused update's 16-bit output, or
//     an fp32 host model's master, which is the shard itself);
//   - checkpoints, gathered-params write-backs and loads use them through
//     FlatOptimizer::resident.
// Along stage 3's recorded order, the shards of the next units are read
// ahead (Stage3Runtime), at most buffer_count of them in memory at once.
//
// On a device model with pin_memory, a gather's shard does not come into
// its pageable host memory at all: it is read into a pinned buffer and
// copied up from there (offload/shard_staging.h); the read ahead fills
// those buffers.
//
// As DeepSpeed's offload_param: the first max_in_cpu shard elements (in
// group order) stay in memory and never touch the disk; a shard over
// buffer_size elements is a config error naming its group.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include "offload/shard_staging.h"
#include "offload/state_swapper.h"
#include "partition/flat_group.h"

namespace zero::offload {

struct ParamSwapOptions {
  SwapperOptions swapper;          // nvme_path, aio, rank (config_key and what are set here)
  int64_t max_in_cpu = 1'000'000'000;  // shard elements kept in memory, in group order
  int64_t buffer_count = 5;            // shards read ahead or in use at once
  int64_t buffer_size = 100'000'000;   // elements: the largest shard allowed
  // A model on a device with pin_memory: gathers take their shards
  // disk -> pinned buffer -> device.
  bool pinned_staging = false;
};

// Gathers whose shard went up from a pinned staging buffer, in this process
// (tests compare it with the gathers of swapped shards).
int64_t gathers_through_pinned_staging();

class ParamSwap {
 public:
  // Opens the swap file (throws std::runtime_error naming a bad nvme_path).
  explicit ParamSwap(ParamSwapOptions options);
  ~ParamSwap();

  // Takes a group's param_shard (page-backed, host) to the swap file --
  // unless it fits in what is left of max_in_cpu -- as grouping makes each
  // group, so the shards never all sit in memory at once. Throws
  // zero::ConfigError for a shard over buffer_size, std::runtime_error for
  // the disk.
  void adopt(const partition::FlatGroup& g);

  // Each no-op for a group whose shard stays in memory (or was never adopted).
  bool swapped(const partition::FlatGroup& g) const { return slot_of(g) >= 0; }
  void prefetch(const partition::FlatGroup& g);  // start reading it into its host memory
  // Start reading it for a gather: into a pinned buffer with pinned
  // staging, else as prefetch().
  void read_ahead_for_gather(const partition::FlatGroup& g);
  // With pinned staging, the shard on `device` (queued up on its current
  // stream) for a gather; nullopt otherwise, or where it is in host memory
  // now: then the gather acquires it.
  std::optional<at::Tensor> upload_for_gather(const partition::FlatGroup& g, at::Device device);
  // In memory until release(); acquires nest. `overwrite`: the caller
  // writes all of the shard before reading it (the step's 16-bit output),
  // so what is on disk is not read.
  void acquire(const partition::FlatGroup& g, bool overwrite = false);
  void release(const partition::FlatGroup& g, bool dirty);
  void flush();                                  // finish background writes

  bool room_to_read_ahead() const;  // fewer than buffer_count shards in memory
  int64_t file_bytes() const { return swapper_->file_bytes(); }

 private:
  int slot_of(const partition::FlatGroup& g) const;  // -1: not swapped

  ParamSwapOptions options_;
  std::unique_ptr<StateSwapper> swapper_;
  std::unique_ptr<ShardStaging> staging_;  // after swapper_: its reads end before the file closes
  std::unordered_map<const void*, int> slot_by_shard_;
  int64_t kept_in_memory_ = 0;  // shard elements under max_in_cpu so far
};

}  // namespace zero::offload

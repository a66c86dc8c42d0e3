/// @file
/// DistributedSampler: which samples of a user's dataset each data-parallel
/// rank reads in an epoch, as torch.utils.data.DistributedSampler does --
/// each rank a disjoint slice of one permutation that every rank computes
/// alike from (seed, epoch) -- and resumable mid-epoch from a checkpoint,
/// also at another world size.
///
///   zero::DistributedSampler sampler(dataset.size(), engine.dp_group().size(), engine.dp_group().rank(),
///                                    {.seed = 42});
///   for (int64_t epoch = 0; ...; ++epoch) {
///     sampler.set_epoch(epoch);
///     for (int64_t i : sampler.indices()) ... dataset[i] ...
///   }
///
/// The epoch's order is the dataset permuted (shuffle) or in order, padded
/// with its own first samples to a multiple of the rank count (unless
/// drop_last, which drops the tail instead), so every rank gets as many
/// samples and the ranks' collectives stay in step; rank r takes positions
/// r, r + N, r + 2N, ... Without padding (size divisible by N, or drop_last)
/// each sample is read once per epoch across the ranks. The permutation is
/// the project's own (SplitMix64 + Fisher-Yates), so it is the same on every
/// machine and libtorch version.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero {

/// torch's DistributedSampler for a dataset of indexed samples: each rank reads a disjoint slice of one permutation fixed by seed and epoch, padded (or cut, with drop_last) so every rank reads as many samples, and it can resume mid-epoch at another world size.
class DistributedSampler {
 public:
  /// What torch's sampler takes besides the sizes.
  struct Options {
    bool shuffle = true;  ///< permute the samples each epoch (by seed and epoch)
    uint64_t seed = 0;  ///< the same on every rank
    bool drop_last = false;  ///< cut the tail instead of padding it with repeated samples
  };

  /// `num_replicas` ranks (the data-parallel size) read a dataset of `dataset_size` samples; this is `rank`'s sampler.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, Options options);
  /// With the default Options.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank)
      : DistributedSampler(dataset_size, num_replicas, rank, Options{}) {}

  /// Starts epoch `epoch` from its beginning (reshuffles).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }  ///< the current epoch

  /// This rank's sample indices for the rest of the epoch, in reading order.
  std::vector<int64_t> indices() const;
  /// This rank's samples in a whole epoch.
  int64_t samples_per_rank() const { return per_rank_; }

  /// Resuming: `global_consumed` samples of the epoch were read (by all ranks
  /// together: steps x micro-batch x gradient accumulation x ranks), so
  /// indices() continues after them. state()/load_state() carry the epoch
  /// and position through a checkpoint's client_state; the world size may
  /// differ on load (the global order does not depend on it, only padding):
  /// the position is rounded down to a whole round of this world's ranks.
  void skip(int64_t global_consumed);
  /// The epoch and position as JSON, for a checkpoint's client_state.
  nlohmann::json state(int64_t global_consumed) const;
  /// Restores what state() returned (also at another world size).
  void load_state(const nlohmann::json& state);

 private:
  std::vector<int64_t> epoch_order() const;  ///< the padded (or cut) global order

  int64_t size_;
  int num_replicas_, rank_;
  Options options_;
  int64_t epoch_ = 0;
  int64_t per_rank_;
  int64_t consumed_ = 0;  ///< global samples of this epoch already read
};

}  // namespace zero

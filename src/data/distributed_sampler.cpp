#include "zero/sampler.h"

#include <numeric>
#include <stdexcept>
#include <string>

namespace zero {

namespace {

// SplitMix64: a small, well-mixed generator whose sequence is fixed by its
// definition (std::mt19937's is too, but the std distributions are not).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % n;
  }
};

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, Options options)
    : size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (dataset_size < 0) throw std::invalid_argument("DistributedSampler: dataset size " + std::to_string(dataset_size));
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(rank) + " of " +
                                std::to_string(num_replicas) + " replicas");
  per_rank_ = options_.drop_last ? size_ / num_replicas_ : (size_ + num_replicas_ - 1) / num_replicas_;
  if (options_.drop_last && per_rank_ == 0 && size_ > 0)
    throw std::invalid_argument("DistributedSampler: " + std::to_string(size_) + " samples cannot feed " +
                                std::to_string(num_replicas_) + " ranks with drop_last");
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  consumed_ = 0;
}

std::vector<int64_t> DistributedSampler::epoch_order() const {
  std::vector<int64_t> order(size_);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    SplitMix64 rng{options_.seed * 0x100000001b3ULL + static_cast<uint64_t>(epoch_)};
    for (int64_t i = size_ - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  const int64_t total = per_rank_ * num_replicas_;
  if (total < size_) order.resize(total);  // drop_last
  for (int64_t i = size_; i < total; ++i) order.push_back(order[(i - size_) % size_]);  // pad
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const auto order = epoch_order();
  std::vector<int64_t> mine;
  for (int64_t p = consumed_ + rank_; p < static_cast<int64_t>(order.size()); p += num_replicas_) mine.push_back(order[p]);
  return mine;
}

void DistributedSampler::skip(int64_t global_consumed) {
  if (global_consumed < 0)
    throw std::invalid_argument("DistributedSampler::skip: " + std::to_string(global_consumed) + " samples consumed");
  // A whole number of rounds of this world size, so every rank has as many
  // samples left: saved at another world size, up to N-1 are read again.
  consumed_ = global_consumed - global_consumed % num_replicas_;
}

nlohmann::json DistributedSampler::state(int64_t global_consumed) const {
  return {{"epoch", epoch_},
          {"consumed", global_consumed},
          {"seed", options_.seed},
          {"shuffle", options_.shuffle},
          {"dataset_size", size_}};
}

void DistributedSampler::load_state(const nlohmann::json& s) {
  if (s.at("dataset_size").get<int64_t>() != size_ || s.at("seed").get<uint64_t>() != options_.seed ||
      s.at("shuffle").get<bool>() != options_.shuffle)
    throw std::invalid_argument("DistributedSampler::load_state: saved for " + s.dump() +
                                ", but this sampler has dataset_size " + std::to_string(size_) + ", seed " +
                                std::to_string(options_.seed) + ", shuffle " + (options_.shuffle ? "true" : "false"));
  set_epoch(s.at("epoch").get<int64_t>());
  skip(s.at("consumed").get<int64_t>());
}

}  // namespace zero

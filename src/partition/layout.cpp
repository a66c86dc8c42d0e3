#include "partition/layout.h"

#include <algorithm>
#include <stdexcept>

namespace zero::partition {

GroupLayout make_group_layout(const std::vector<int64_t>& param_numels,
                              const std::vector<int64_t>& param_indices, int dp_size, int64_t align) {
  if (dp_size < 1 || align < 1) throw std::invalid_argument("make_group_layout: dp_size and align must be >= 1");
  if (param_numels.size() != param_indices.size())
    throw std::invalid_argument("make_group_layout: numels and indices differ in length");
  GroupLayout g;
  g.dp_size = dp_size;
  for (size_t i = 0; i < param_numels.size(); ++i) {
    g.params.push_back({param_indices[i], g.numel, param_numels[i]});
    g.numel += param_numels[i];
  }
  const int64_t unit = align * dp_size;
  g.padded_numel = std::max<int64_t>(unit, (g.numel + unit - 1) / unit * unit);
  g.shard_numel = g.padded_numel / dp_size;
  return g;
}

std::vector<Fragment> GroupLayout::fragments(int rank) const {
  std::vector<Fragment> out;
  const int64_t lo = rank * shard_numel, hi = lo + shard_numel;
  for (const auto& p : params) {
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel);
    if (a < b) out.push_back({p.param_index, a - p.offset, a - lo, b - a});
  }
  return out;
}

std::vector<std::vector<int64_t>> bucket_params(const std::vector<int64_t>& numels_in_order,
                                                const std::vector<int64_t>& indices_in_order,
                                                int64_t bucket_numel) {
  std::vector<std::vector<int64_t>> buckets;
  int64_t filled = 0;
  for (size_t i = 0; i < numels_in_order.size(); ++i) {
    if (buckets.empty() || filled >= bucket_numel) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(indices_in_order[i]);
    filled += numels_in_order[i];
  }
  return buckets;
}

}  // namespace zero::partition

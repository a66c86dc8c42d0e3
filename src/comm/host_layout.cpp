#include "comm/host_layout.h"

#include <algorithm>

namespace zero::comm {

std::vector<int> HostLayout::ranks_on_host(int h) const {
  std::vector<int> out(per_host);
  for (size_t r = 0; r < host_of.size(); ++r)
    if (host_of[r] == h) out[local_of[r]] = static_cast<int>(r);
  return out;
}

std::vector<int> HostLayout::ranks_at_local(int l) const {
  std::vector<int> out(hosts);
  for (size_t r = 0; r < host_of.size(); ++r)
    if (local_of[r] == l) out[host_of[r]] = static_cast<int>(r);
  return out;
}

std::optional<HostLayout> host_layout(const std::vector<std::string>& hosts) {
  HostLayout lay;
  std::vector<std::string> seen;
  std::vector<int> count;
  for (const auto& h : hosts) {
    auto it = std::find(seen.begin(), seen.end(), h);
    const int index = static_cast<int>(it - seen.begin());
    if (it == seen.end()) seen.push_back(h), count.push_back(0);
    lay.host_of.push_back(index);
    lay.local_of.push_back(count[index]++);
  }
  lay.hosts = static_cast<int>(seen.size());
  if (lay.hosts < 2 || count[0] < 2) return std::nullopt;
  for (int c : count)
    if (c != count[0]) return std::nullopt;
  lay.per_host = count[0];
  return lay;
}

}  // namespace zero::comm

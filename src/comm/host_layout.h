// Where a group's ranks sit: which host each is on and its index there.
// A group spanning several hosts with the same number of its ranks on each
// (2 or more) can run hierarchical collectives (comm/hierarchical_transport.h)
// and ZeRO++'s hpZ: "intra" groups hold one host's ranks, "inter" groups
// the ranks with the same local index, one per host.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace zero::comm {

struct HostLayout {
  int hosts = 0;                 // H
  int per_host = 0;              // L: the group's ranks on each host
  std::vector<int> host_of;      // group rank -> host index (hosts in order of first appearance)
  std::vector<int> local_of;     // group rank -> index among its host's ranks (group order)
  // Group ranks of host h in local order, and with local index l in host order.
  std::vector<int> ranks_on_host(int h) const;
  std::vector<int> ranks_at_local(int l) const;
};

// The layout of a group whose members (in group order) are on `hosts`
// (host identities), or nullopt when it is on one host, has one rank per
// host, or an uneven number of ranks per host.
std::optional<HostLayout> host_layout(const std::vector<std::string>& hosts);

}  // namespace zero::comm

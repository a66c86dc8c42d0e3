#include "zero/comm_counters.h"

namespace zero::comm {

const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllGather: return "allgather";
    case CollectiveOp::ReduceScatter: return "reduce_scatter";
    case CollectiveOp::AllReduce: return "all_reduce";
    case CollectiveOp::Broadcast: return "broadcast";
    case CollectiveOp::Barrier: return "barrier";
  }
  return "?";
}

OpCount& OpCount::operator+=(const OpCount& o) {
  calls += o.calls;
  bytes += o.bytes;
  wire_bytes += o.wire_bytes;
  for (const auto& [t, n] : o.calls_by_transport) calls_by_transport[t] += n;
  for (const auto& [t, n] : o.bytes_by_transport) bytes_by_transport[t] += n;
  return *this;
}

void CommCounters::record(const std::string& group, CollectiveOp op, const std::string& transport,
                          int64_t bytes, int64_t wire_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  OpCount& c = by_group_[group][to_string(op)];
  c.calls += 1;
  c.bytes += bytes;
  c.wire_bytes += wire_bytes;
  c.calls_by_transport[transport] += 1;
  c.bytes_by_transport[transport] += bytes;
}

OpCounts CommCounters::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  OpCounts out;
  for (const auto& [g, ops] : by_group_)
    for (const auto& [op, c] : ops) out[op] += c;
  return out;
}

OpCounts CommCounters::for_group(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_group_.find(group);
  return it == by_group_.end() ? OpCounts{} : it->second;
}

void CommCounters::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  by_group_.clear();
}

OpCounts diff(const OpCounts& after, const OpCounts& before) {
  OpCounts out;
  for (const auto& [op, a] : after) {
    OpCount d = a;
    if (auto it = before.find(op); it != before.end()) {
      d.calls -= it->second.calls;
      d.bytes -= it->second.bytes;
      d.wire_bytes -= it->second.wire_bytes;
      for (const auto& [t, n] : it->second.calls_by_transport) d.calls_by_transport[t] -= n;
      for (const auto& [t, n] : it->second.bytes_by_transport) d.bytes_by_transport[t] -= n;
    }
    // Transports that served none of the calls in between are left out.
    for (auto it = d.calls_by_transport.begin(); it != d.calls_by_transport.end();)
      if (it->second == 0) d.bytes_by_transport.erase(it->first), it = d.calls_by_transport.erase(it);
      else ++it;
    if (d.calls) out[op] = d;
  }
  return out;
}

}  // namespace zero::comm

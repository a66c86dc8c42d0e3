/// @file
/// Always-on counters of collectives: calls and bytes per op, per group and
/// per transport. Tests and benchmarks read them as oracles ("one
/// reduce-scatter of Ψ elements per step"), so they count what was asked of
/// the dispatcher, not what a transport happened to do internally.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace zero::comm {

/// The collectives the dispatcher counts.
enum class CollectiveOp { AllGather, ReduceScatter, AllReduce, Broadcast, Barrier };
/// Its name in counters and logs ("allgather", "reduce_scatter", "all_reduce", "broadcast", "barrier").
const char* to_string(CollectiveOp op);

/// Counts of one op (for one group, or summed over groups).
struct OpCount {
  int64_t calls = 0;  ///< collectives issued
  /// Logical payload: the full buffer of the collective in its own dtype
  /// (allgather: output, reduce-scatter: input, all-reduce / broadcast: the tensor).
  int64_t bytes = 0;
  /// What this rank sends under the transport's algorithm (e.g. a ring
  /// all-reduce sends 2(N-1)/N of the buffer).
  int64_t wire_bytes = 0;
  std::map<std::string, int64_t> calls_by_transport;  ///< `calls`, split by the transport that served them
  std::map<std::string, int64_t> bytes_by_transport;  ///< `bytes`, split by who served them

  /// Adds another count to this one, field by field.
  OpCount& operator+=(const OpCount& o);
};

/// op name -> counts
using OpCounts = std::map<std::string, OpCount>;

/// The counters a dispatcher keeps (Comm::counters()); thread-safe.
class CommCounters {
 public:
  /// Counts one collective of `group`, served by `transport`.
  void record(const std::string& group, CollectiveOp op, const std::string& transport,
              int64_t bytes, int64_t wire_bytes);
  /// Per op, summed over groups.
  OpCounts totals() const;
  /// Per op for one group (empty if the group made no calls).
  OpCounts for_group(const std::string& group) const;
  void reset();  ///< forgets every count

 private:
  mutable std::mutex mu_;
  std::map<std::string, OpCounts> by_group_;
};

/// `after - before`, per op: the counts of the calls made in between.
OpCounts diff(const OpCounts& after, const OpCounts& before);

}  // namespace zero::comm

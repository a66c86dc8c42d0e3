// The comms log (DeepSpeed's comms_logger): each collective the dispatcher
// runs while it is on and that completes, with its op, message size, group
// size and the time this rank spent on it -- inside the call, plus inside
// the wait of its handle (a poll that finds it done adds none; a handle
// dropped unwaited counts its call alone). Time the rank spent computing
// between issuing a prefetched gather and waiting for it is not counted:
// what is logged is the collective's exposed time. Process-wide, off by
// default, thread-safe; the Python front end drains it into its logger.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/comm.h"

namespace zero::comm::comm_log {

struct Record {
  std::string op;           // DeepSpeed's name: all_gather_into_tensor, reduce_scatter_tensor, all_reduce, ...
  int64_t message_bytes;    // DeepSpeed's message size: a gather's input shard, a reduce-scatter's whole
                            // input, else the tensor
  int group_size;
  double ms;
};

void set_enabled(bool on);
bool enabled();
// The records since the last drain, in completion order.
std::vector<Record> drain();

using Clock = std::chrono::steady_clock;
// `work`, logged when it completes (unchanged while the log is off).
WorkHandle timed(CollectiveOp op, int64_t message_bytes, int group_size, Clock::time_point issued,
                 WorkHandle work);

}  // namespace zero::comm::comm_log

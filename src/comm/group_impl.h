// What a Group holds for the transports: its backend communicator.
#pragma once

#include <chrono>

#include <c10/util/intrusive_ptr.h>

#include "compat/torch_compat.h"
#include "zero/comm.h"

namespace zero::comm {

struct Group::Impl {
  c10::intrusive_ptr<compat::CollectiveBackend> backend;
  std::chrono::milliseconds timeout;
};

}  // namespace zero::comm

// Shared by the multi-rank tests: the World of this process. Every rank runs
// the same gtest binary under zero-run, so tests (and their collectives) run
// in the same order everywhere; each rank checks its own results.
#pragma once

#include "zero/comm.h"

namespace zero::test {

World& world();

}  // namespace zero::test

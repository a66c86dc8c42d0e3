// Test hooks of the I/O engine (tests/unit/aio_engine_test.cpp); nothing
// else calls them.
#pragma once

namespace zero::io::testing {

// While on, every piece is submitted for only half its length (whole blocks
// of kAlignment), so the kernel's answers come back short and the engine's
// resubmission of the rest is exercised on any filesystem.
void split_transfers(bool on);

}  // namespace zero::io::testing

// Names what a released stage-3 buffer held. Between a unit's uses its full
// param buffer keeps its address but its pages are returned to the OS and
// the range is made inaccessible (PROT_NONE), so any read or write of a
// released param faults. libtorch has no hook on tensor access that could
// turn such a read into an exception, so instead of a bare segmentation
// fault (or, with storage freed, garbage) the process stops with a message
// naming the param and what to do. The SIGSEGV handler chains to any
// handler installed before it for addresses it does not know. No torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero::memory {

struct NamedRange {
  size_t offset = 0;  // bytes from the region's start
  size_t bytes = 0;
  std::string name;   // e.g. "param 'h0.fc.weight' (unit 'h0')"
};

// Registers [base, base + bytes); returns an id for unregister. `advice`
// follows the name in the message. Thread-safe; installs the handler once.
int register_released_region(const void* base, size_t bytes, std::vector<NamedRange> ranges, std::string advice);
void unregister_released_region(int id);

// A note printed after every region's advice: a front end naming its own
// API (the Python package names deepspeed.zero.GatheredParameters where
// the advice names the C++ engine's). Set once, before training; the text
// is kept for the life of the process.
void set_released_access_note(std::string note);

}  // namespace zero::memory

// Test-only fault injection, for the fault suite (tests/faults/). Nothing
// happens unless the environment variable ZERO_FAULT is set; it is read
// once per process:
//
//   ZERO_FAULT=<rank>:<point>:<kind>[:<nth>]
//
// makes the process whose RANK (the launcher's variable) is <rank> fail at
// its <nth> pass (default 1) through <point>, as <kind>:
//   kill    raise(SIGKILL): a crash; nothing unwinds, nothing is said
//   throw   a std::runtime_error thrown from the point
//   exit    std::exit(3): atexit handlers and static destructors run while
//           the process's other threads go on
// Points (each counted per process):
//   forward   zero-train's loop, inside engine.forward (stage 3: root gathered)
//   backward  zero-train's loop, mid-backward (a grad hook on the first block)
//   step      zero-train's loop, before engine.step()
//   save      save_checkpoint, once this rank's file is written, before the
//             save is agreed on and published
//   load      load_checkpoint, once part of this rank's state has been read
// Just before failing, the process prints one line to stderr:
//   zero-fault: rank R: KIND at POINT #N (unix time T)
#pragma once

namespace zero::fault {

// True when ZERO_FAULT names this process and `point` (to set up a hook
// only where one can fire).
bool armed(const char* point);

// One pass through `point`; fails as ZERO_FAULT says at the nth pass.
void point(const char* point);

}  // namespace zero::fault

// On/off switches read from the environment (ZERO_COMM_FASTPATH,
// ZERO_HIERARCHICAL, ZERO_CUDA_IPC, ZERO_CUDA_IPC_DIRECT): on, auto, 1 or
// true mean on; off, 0 or false mean off; unset means `unset` (on unless
// the switch says otherwise); anything else is an error naming the variable.
#pragma once

#include <cstdlib>
#include <string>

#include "zero/comm.h"

namespace zero::comm {

inline bool env_switch_on(const char* name, bool unset = true) {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset;
  const std::string s = v;
  if (s == "off" || s == "0" || s == "false") return false;
  if (s == "on" || s == "auto" || s == "1" || s == "true") return true;
  throw CommError(std::string(name) + "=" + s + ": expected on, auto or off");
}

}  // namespace zero::comm

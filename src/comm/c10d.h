// The parts of c10d (libtorch's distributed runtime) the Gloo backend uses:
// TCPStore and ProcessGroupGloo, a c10d::Backend since libtorch 2.0.
#pragma once

#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3),
              "zero-cpp builds against libtorch 2.3 or newer (./run deps installs the pinned wheel)");

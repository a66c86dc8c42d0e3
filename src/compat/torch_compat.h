// The one place where libtorch 1.13 (Debian) and 2.x (pytorch.org) differ
// for this project. Everything else includes this instead of spelling the
// version-specific names.
#pragma once

#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

// c10::Allocator::allocate lost its const, and gained a pure copy_data(),
// in libtorch 2.3.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define ZERO_ALLOCATOR_CONST
#define ZERO_ALLOCATOR_NEEDS_COPY_DATA 1
#else
#define ZERO_ALLOCATOR_CONST const
#define ZERO_ALLOCATOR_NEEDS_COPY_DATA 0
#endif

namespace zero::compat {

#if TORCH_VERSION_MAJOR >= 2
// 2.x split ProcessGroup into a dispatching front and per-device Backends;
// ProcessGroupGloo / ProcessGroupNCCL are Backends.
using CollectiveBackend = ::c10d::Backend;
#else
// 1.13: ProcessGroupGloo is itself a ProcessGroup.
using CollectiveBackend = ::c10d::ProcessGroup;
#endif

using C10dWork = ::c10d::Work;

}  // namespace zero::compat

#include "memory/malloc_policy.h"

#include <cstdlib>
#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace zero::memory {

bool fix_mmap_threshold(size_t bytes) {
#if defined(__GLIBC__)
  if (bytes == 0 || std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return false;
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)) == 1;
#else
  (void)bytes;
  return false;
#endif
}

}  // namespace zero::memory

// The message a read of a released stage-3 buffer stops the process with,
// and that the SIGSEGV handler leaves every other segfault alone.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "memory/release_guard.h"

namespace {

using zero::memory::register_released_region;
using zero::memory::unregister_released_region;

struct Region {
  Region() {
    base = static_cast<char*>(mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    id = register_released_region(base, kBytes, {{0, 64, "param 'fc.weight'"}, {64, 128, "param 'fc.bias'"}},
                                  "read it inside engine.gathered_parameters()");
  }
  ~Region() {
    unregister_released_region(id);
    munmap(base, kBytes);
  }
  static constexpr size_t kBytes = 4096;
  char* base;
  int id;
};

// Not inlined: the access must happen here, at an address GCC cannot see into.
[[gnu::noinline]] int read_byte(const volatile char* p) { return *p; }

TEST(ReleaseGuardDeathTest, AnAccessNamesTheParamAndTheWayOut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Region r;
  EXPECT_DEATH(read_byte(r.base + 100),
               "zero-cpp: fatal: param 'fc.bias' was read or written while released: read it inside "
               "engine.gathered_parameters\\(\\)");
  EXPECT_DEATH(read_byte(r.base + 8), "param 'fc.weight'");
  EXPECT_DEATH(read_byte(r.base + 1000), "the padding of a stage-3 flat buffer");
}

TEST(ReleaseGuardDeathTest, OtherSegfaultsStaySegfaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Region r;  // the handler is installed
  EXPECT_EXIT(read_byte(reinterpret_cast<const char*>(16)), testing::KilledBySignal(SIGSEGV), "^$");
  EXPECT_EXIT(kill(getpid(), SIGSEGV), testing::KilledBySignal(SIGSEGV), "^$");
  unregister_released_region(r.id);
  r.id = -1;
  EXPECT_EXIT(read_byte(r.base), testing::KilledBySignal(SIGSEGV), "^$");  // no longer ours
}

}  // namespace

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "mr.h"

#ifdef ZERO_TEST_DEVICE_SUPPORT
#include "support/test_device.h"
#endif

namespace zero::test {

namespace {
std::shared_ptr<World> g_world;
World* g_leaked = nullptr;
}

World& world() { return g_leaked ? *g_leaked : *g_world; }

}  // namespace zero::test

// ZERO_TEST_SHUTDOWN says how the program ends its world (the shutdown
// test, tests/scripts/shutdown_test.sh, runs each):
//   explicit (default)  World::shutdown() after the tests, then a collective,
//                       which must be refused naming the shutdown;
//   static              forgotten: the World stays in a static until exit;
//   leak                forgotten: the World is never destroyed at all.
// Either forgotten way the exit handler init_distributed installs must end
// the world cleanly (exit 0, no thread left running, nothing in /dev/shm).
//
// ZERO_TEST_DEVICE=zdev (the device suite): the CPU-backed test device is
// installed first, so init_distributed makes zdev:LOCAL_RANK%2 each rank's
// device, and its tensors travel through the CPU transports.
int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const char* device_env = std::getenv("ZERO_TEST_DEVICE");
  const bool zdev = device_env && std::string(device_env) == "zdev";
#ifdef ZERO_TEST_DEVICE_SUPPORT
  if (zdev) zero::test_device::install(2);
#else
  if (zdev) {
    std::fprintf(stderr, "ZERO_TEST_DEVICE=zdev: this test binary is not linked with the test device\n");
    return 2;
  }
#endif
  const char* mode_env = std::getenv("ZERO_TEST_SHUTDOWN");
  const std::string mode = mode_env ? mode_env : "explicit";
  if (mode == "leak") {
    zero::test::g_leaked = (new std::shared_ptr<zero::World>(zero::init_distributed()))->get();  // never freed
  } else {
    zero::test::g_world = zero::init_distributed();
  }
  if (zdev) zero::test::world().comm().serve_as_host_memory(c10::DeviceType::PrivateUse1);
  int rc = RUN_ALL_TESTS();
  if (mode == "explicit") {
    zero::World& w = zero::test::world();
    w.shutdown();
    try {
      w.comm().barrier(w.group())->wait();
      std::fprintf(stderr, "a collective after World::shutdown() was not refused\n");
      rc = rc ? rc : 3;
    } catch (const zero::comm::CommError& e) {
      if (std::string(e.what()).find("shut down") == std::string::npos) {
        std::fprintf(stderr, "a collective after World::shutdown() failed without naming it: %s\n", e.what());
        rc = rc ? rc : 3;
      }
    }
  }
  // A failed rank must not leave its peers waiting in a later collective:
  // exiting non-zero makes zero-run stop the others.
  return rc;
}

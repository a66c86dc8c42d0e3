#include <gtest/gtest.h>

#include "mr.h"

namespace zero::test {

namespace {
std::shared_ptr<World> g_world;
}

World& world() { return *g_world; }

}  // namespace zero::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  zero::test::g_world = zero::init_distributed();
  int rc = RUN_ALL_TESTS();
  // A failed rank must not leave its peers waiting in a later collective:
  // exiting non-zero makes zero-run stop the others.
  return rc;
}

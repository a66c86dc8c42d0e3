// tests/scripts/stdout_test.sh's rank: prints one line to stdout after
// init_distributed and is then killed. Its line reaches the launcher only if
// stdout is line buffered (a pipe is block buffered by default, and a
// killed process never flushes).
#include <csignal>
#include <cstdio>
#include <cstring>

#include "zero/comm.h"

int main(int argc, char** argv) {
  auto world = zero::init_distributed();
  std::printf("stdout_probe: rank %d's line\n", world->rank());
  if (argc > 1 && std::strcmp(argv[1], "--exit") == 0) return 0;
  std::raise(SIGKILL);
}

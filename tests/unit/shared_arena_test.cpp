// The process's shared memory for flat buffers (src/memory/shared_arena.h):
// one descriptor for any number of buffers, and a freed buffer seen from a
// peer's mapping reads as zeros -- its pages gone, the file never shrunk
// (which a reader would meet as SIGBUS).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "memory/shared_arena.h"

namespace {

using zero::memory::free_shared_range;
using zero::memory::map_shared_range;
using zero::memory::SharedRange;

int open_descriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

TEST(SharedArena, OneDescriptorForAnyNumberOfBuffers) {
  const int before = open_descriptors();
  std::vector<SharedRange> ranges;
  for (int i = 0; i < 300; ++i) {
    auto r = map_shared_range(4096 * (1 + i % 5));
    if (!r) GTEST_SKIP() << "no memfd on this system";
    std::memset(r->ptr, i, r->bytes);
    ranges.push_back(*r);
  }
  EXPECT_LE(open_descriptors() - before, 1);
  for (const auto& r : ranges) {
    EXPECT_EQ(r.fd, ranges.front().fd);
    EXPECT_EQ(r.offset % 4096, 0);
  }
  for (const auto& r : ranges) free_shared_range(r);
}

// A peer's view of the range, as comm/shm/peer_buffers.h maps it.
const char* map_as_a_peer(const SharedRange& r) {
  const int fd = open(("/proc/self/fd/" + std::to_string(r.fd)).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = mmap(nullptr, r.bytes, PROT_READ, MAP_SHARED, fd, r.offset);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<const char*>(p);
}

TEST(SharedArena, AFreedRangeReadsAsZerosAndIsReusedZeroFilled) {
  auto r = map_shared_range(1 << 20);
  if (!r) GTEST_SKIP() << "no memfd on this system";
  std::memset(r->ptr, 7, r->bytes);
  const char* peer = map_as_a_peer(*r);
  ASSERT_NE(peer, nullptr);
  EXPECT_EQ(peer[r->bytes - 1], 7);
  free_shared_range(*r);
  for (size_t i = 0; i < r->bytes; i += 4096) ASSERT_EQ(peer[i], 0) << "byte " << i;  // not SIGBUS

  auto again = map_shared_range(1 << 20);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->offset, r->offset) << "the freed range of that size is reused";
  EXPECT_EQ(again->ptr[0], 0);
  again->ptr[0] = 9;
  EXPECT_EQ(peer[0], 9) << "a peer's cached mapping of the range serves the new buffer";
  free_shared_range(*again);
  munmap(const_cast<char*>(peer), r->bytes);
}

// No descriptor for the memfd: an error naming the limit, not a buffer that
// quietly turns private (which its peers could then not map). In a child,
// whose first shared buffer makes its own memfd.
TEST(SharedArena, NoDescriptorForTheMemfdIsAnErrorNamingTheLimit) {
  const pid_t pid = fork();
  if (pid == 0) {
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = 3;  // stdin, stdout, stderr
    setrlimit(RLIMIT_NOFILE, &r);
    try {
      map_shared_range(4096);
      _exit(1);  // made one, or went private
    } catch (const std::runtime_error& e) {
      _exit(std::string(e.what()).find("out of file descriptors (ulimit -n 3)") != std::string::npos ? 0 : 2);
    }
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error; 2: an error not naming the limit";
}

}  // namespace

// The process's shared memory for flat buffers (src/memory/shared_arena.h):
// one descriptor for any number of buffers, and a freed buffer seen from a
// peer's mapping reads as zeros -- its pages gone, the file never shrunk
// (which a reader would meet as SIGBUS) -- unless a KeepFreedSharedPages
// scope keeps them for the next buffer of its size.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
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
  // The one memfd, as the stats name it (to tell its ranges from a peer's).
  struct stat st {};
  ASSERT_EQ(fstat(ranges.front().fd, &st), 0);
  EXPECT_EQ(zero::memory::shared_arena_stats().memfd_inode, static_cast<uint64_t>(st.st_ino));
  EXPECT_EQ(ranges.front().inode, static_cast<uint64_t>(st.st_ino));
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

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::ptrdiff_t g_observed = 0;
void observe(std::ptrdiff_t bytes) { g_observed += bytes; }

// Installs `observe` for a test's length, the observer before it back after.
struct Observing {
  Observing() : previous(zero::memory::set_kept_bytes_observer(&observe)) { g_observed = 0; }
  ~Observing() { zero::memory::set_kept_bytes_observer(previous); }
  zero::memory::KeptBytesObserver previous;
};

// A buffer's range as memory/page_buffer.cpp asks for one: a kept range of
// its size, else a fresh one.
std::optional<SharedRange> range_for(size_t bytes) {
  if (auto r = zero::memory::take_kept_range(bytes)) return r;
  return map_shared_range(bytes);
}

// Within a scope a freed range keeps its pages: the next buffer of its size
// takes them, zero-filled, without faulting a page in -- where a fresh
// range faults its pages in (in 4 KiB pages, or 2 MiB ones where the
// system gives memfds huge pages). The allocator's observer is told the
// bytes kept; a range taken back stays counted, now in use.
TEST(SharedArena, AScopeKeepsAFreedRangesPagesForTheNextOfItsSize) {
  constexpr size_t kBytes = 4 << 20;
  Observing observing;
  long fresh_faults = 0;
  {
    auto fresh = map_shared_range(kBytes);
    if (!fresh) GTEST_SKIP() << "no memfd on this system";
    const long before = minor_faults();
    std::memset(fresh->ptr, 7, kBytes);
    fresh_faults = minor_faults() - before;
    EXPECT_GE(fresh_faults, 2) << "the oracle: fresh pages fault in";
    free_shared_range(*fresh);
  }
  EXPECT_FALSE(zero::memory::take_kept_range(kBytes)) << "outside a scope nothing is kept";
  zero::memory::KeepFreedSharedPages keep;
  auto first = range_for(kBytes);
  ASSERT_TRUE(first);
  std::memset(first->ptr, 7, kBytes);
  const char* peer = map_as_a_peer(*first);
  ASSERT_NE(peer, nullptr);
  const uint64_t reuses = zero::memory::shared_arena_stats().kept_reuses;
  free_shared_range(*first);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kBytes);
  EXPECT_EQ(g_observed, static_cast<std::ptrdiff_t>(kBytes));
  EXPECT_EQ(peer[kBytes - 1], 7) << "kept: its pages stay";

  const long before = minor_faults();
  auto second = range_for(kBytes);
  ASSERT_TRUE(second);
  std::memset(second->ptr, 5, kBytes);
  EXPECT_LT((minor_faults() - before) * 8, fresh_faults) << "the kept pages serve the next buffer of their size";
  EXPECT_EQ(second->offset, first->offset);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_reuses, reuses + 1);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 0u);
  EXPECT_EQ(g_observed, static_cast<std::ptrdiff_t>(kBytes)) << "in use again: still counted";
  free_shared_range(*second);
  munmap(const_cast<char*>(peer), kBytes);
}

// ... and the last one freed, of a size the scope mapped afresh, is carried
// past its end (the next backward's first grad buffer takes it: the
// following test); given back, its pages go.
TEST(SharedArena, AKeptRangeIsZeroFilledWhenTakenBackAndPunchedWhenGivenBack) {
  constexpr size_t kBytes = 1 << 20;
  zero::memory::release_kept_shared_pages();  // what the test before carried
  Observing observing;
  const char* peer = nullptr;
  std::ptrdiff_t observed_in_scope = 0;
  {
    zero::memory::KeepFreedSharedPages keep;
    auto r = range_for(kBytes);
    if (!r) GTEST_SKIP() << "no memfd on this system";
    std::memset(r->ptr, 7, kBytes);
    free_shared_range(*r);
    auto again = range_for(kBytes);
    ASSERT_TRUE(again);
    ASSERT_EQ(again->ptr, r->ptr);
    for (size_t i = 0; i < kBytes; i += 512) ASSERT_EQ(again->ptr[i], 0) << "byte " << i;
    std::memset(again->ptr, 3, kBytes);
    peer = map_as_a_peer(*again);
    ASSERT_NE(peer, nullptr);
    free_shared_range(*again);
    EXPECT_EQ(peer[0], 3);
    observed_in_scope = g_observed;
  }
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kBytes) << "carried past the scope";
  EXPECT_EQ(peer[0], 3);
  zero::memory::release_kept_shared_pages();
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 0u);
  EXPECT_EQ(g_observed, observed_in_scope - static_cast<std::ptrdiff_t>(kBytes)) << "told the pages went";
  for (size_t i = 0; i < kBytes; i += 4096) ASSERT_EQ(peer[i], 0) << "byte " << i << ": its pages went back";
  munmap(const_cast<char*>(peer), kBytes);
}

// The bound: what is in use plus what is kept never passes the most in use
// at once since the scope began by more than the 32 MiB slack. A request of
// another size that would pass it punches kept ranges out first; a smaller
// one within the slack does not; a released buffer (no pages) is not kept.
TEST(SharedArena, KeptRangesNeverRaiseThePeakPastTheSlack) {
  constexpr size_t kMiB = 1 << 20, kUnit = 40 * kMiB;
  zero::memory::release_kept_shared_pages();  // what an earlier test carried
  zero::memory::KeepFreedSharedPages keep;
  auto a = map_shared_range(kUnit);
  if (!a) GTEST_SKIP() << "no memfd on this system";
  auto b = map_shared_range(kUnit);  // the peak: 80 MiB
  std::memset(a->ptr, 1, kUnit);
  std::memset(b->ptr, 1, kUnit);
  const char* peer_a = map_as_a_peer(*a);
  ASSERT_NE(peer_a, nullptr);
  free_shared_range(*a);
  free_shared_range(*b, /*resident=*/false);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kUnit) << "b's pages were gone already";
  auto small = map_shared_range(kMiB);  // 1 in use + 40 kept: within the peak and the slack
  ASSERT_TRUE(small);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kUnit);
  EXPECT_EQ(peer_a[0], 1) << "still kept";
  auto c = map_shared_range(2 * kUnit);  // 81 in use + 40 kept > 81 + 32: a goes
  ASSERT_TRUE(c);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 0u);
  EXPECT_EQ(peer_a[0], 0) << "punched out";
  free_shared_range(*c);
  free_shared_range(*small);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 2 * kUnit + kMiB);
  munmap(const_cast<char*>(peer_a), kUnit);
}

// Where the scope ends, the most recently freed range of each size it
// mapped afresh is carried to the next scope (the first grad buffer of the
// next backward, of each unit size), within the largest of them and the
// slack; the rest are punched out. The next scope's first request of that
// size takes it, zero-filled; a range mapped outside any scope punches
// what is carried first.
TEST(SharedArena, TheLastFreedRangeOfEachSizeIsCarriedToTheNextScope) {
  constexpr size_t kMiB = 1 << 20, kUnit = 40 * kMiB;
  zero::memory::release_kept_shared_pages();
  std::optional<SharedRange> older, newer, root;
  {
    zero::memory::KeepFreedSharedPages keep;
    older = map_shared_range(kUnit);
    if (!older) GTEST_SKIP() << "no memfd on this system";
    newer = map_shared_range(kUnit);
    root = map_shared_range(kMiB);
    for (auto* r : {&*older, &*newer, &*root}) std::memset(r->ptr, 9, r->bytes);
    free_shared_range(*older);
    free_shared_range(*newer);
    free_shared_range(*root);
    EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 2 * kUnit + kMiB);
  }
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kUnit + kMiB) << "the newer unit range and the root's";
  {
    zero::memory::KeepFreedSharedPages keep;
    const uint64_t reuses = zero::memory::shared_arena_stats().kept_reuses;
    auto again = map_shared_range(kMiB);  // the root's fresh map: within the slack, the unit range stays
    auto unit = zero::memory::take_kept_range(kUnit);
    ASSERT_TRUE(unit);
    EXPECT_EQ(unit->offset, newer->offset) << "the most recently freed of its size";
    for (size_t i = 0; i < kUnit; i += 4096) ASSERT_EQ(unit->ptr[i], 0) << "byte " << i;
    EXPECT_EQ(zero::memory::shared_arena_stats().kept_reuses, reuses + 1);
    EXPECT_FALSE(zero::memory::take_kept_range(kUnit)) << "the older one was punched at the scope's end";
    free_shared_range(*unit);
    if (again) free_shared_range(*again);
  }
  EXPECT_GT(zero::memory::shared_arena_stats().kept_bytes, 0u);
  auto outside = map_shared_range(kMiB);  // outside any scope: what is carried goes
  ASSERT_TRUE(outside);
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, 0u);
  free_shared_range(*outside);
}

// A size whose first request a scope served from what the last one carried
// is carried again: every backward's first grad buffer takes the pages the
// one before left it, not every other backward's (where the scope that took
// a carried range, having mapped none of its size afresh, carried none on).
TEST(SharedArena, ARangeTakenFromTheCarryIsCarriedOnAgain) {
  constexpr size_t kMiB = 1 << 20, kUnit = 8 * kMiB;
  zero::memory::release_kept_shared_pages();
  {
    zero::memory::KeepFreedSharedPages keep;
    auto fresh = map_shared_range(kUnit);
    if (!fresh) GTEST_SKIP() << "no memfd on this system";
    std::memset(fresh->ptr, 9, kUnit);
    free_shared_range(*fresh);
  }
  ASSERT_EQ(zero::memory::shared_arena_stats().kept_bytes, kUnit) << "carried into the first scope after";
  for (int scope = 0; scope < 3; ++scope) {
    SCOPED_TRACE("scope " + std::to_string(scope));
    zero::memory::KeepFreedSharedPages keep;
    auto carried = zero::memory::take_kept_range(kUnit);
    ASSERT_TRUE(carried) << "the last scope carried nothing of this size";
    std::memset(carried->ptr, 9, kUnit);
    free_shared_range(*carried);
  }
  EXPECT_EQ(zero::memory::shared_arena_stats().kept_bytes, kUnit);
  zero::memory::release_kept_shared_pages();
}

// A scope opened before the process's first shared buffer keeps what is
// freed in it, as any other (the arena, made at that buffer, once dropped
// the scope as if a forked child had inherited it). In a process of its
// own: gtest's threadsafe death test runs the case in a fresh one.
TEST(SharedArena, AScopeOpenedBeforeTheFirstBufferKeeps) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kBytes = 1 << 20;
  EXPECT_EXIT(
      {
        zero::memory::KeepFreedSharedPages keep;
        auto r = map_shared_range(kBytes);
        if (!r) std::_Exit(0);  // no memfd on this system: nothing is kept anywhere
        free_shared_range(*r);
        std::_Exit(zero::memory::shared_arena_stats().kept_bytes == kBytes ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// A forked child keeps freed pages under its own scopes only: not under one
// its parent had open when it forked (that scope never ends in the child;
// here the parent had not used the arena yet), and under its own as under
// any other -- one opened after its first buffer, and one opened before it
// in a child of a parent that had used the arena (the child's first buffer
// makes its own memfd). In a fresh process (gtest's threadsafe death test).
TEST(SharedArena, AForkedChildKeepsUnderItsOwnScopesOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kBytes = 1 << 20;
  // In a child: 0 where its buffers were kept as they should be; 1: kept
  // under its parent's scope; 2: its own scope kept nothing (99: it died).
  const auto child = [](bool parents_scope_open) {
    if (parents_scope_open) {  // a buffer of its own, freed under its parent's scope
      if (auto r = map_shared_range(kBytes)) {
        free_shared_range(*r);
        if (zero::memory::shared_arena_stats().kept_bytes != 0) return 1;
      }
    }
    zero::memory::release_kept_shared_pages();
    zero::memory::KeepFreedSharedPages own;
    auto r = map_shared_range(kBytes);
    if (!r) return 0;  // no memfd on this system: nothing is kept anywhere
    free_shared_range(*r);
    return zero::memory::shared_arena_stats().kept_bytes == kBytes ? 0 : 2;
  };
  const auto in_a_child = [](const std::function<int()>& body) {
    const pid_t pid = fork();
    if (pid == 0) std::_Exit(body());
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
  };
  EXPECT_EXIT(
      {
        int failed = 0;
        {
          zero::memory::KeepFreedSharedPages parents;  // the arena not used yet
          failed = in_a_child([&] { return child(/*parents_scope_open=*/true); });
        }
        if (failed == 0) {
          if (auto r = map_shared_range(kBytes)) free_shared_range(*r);  // the parent has used it
          failed = in_a_child([&] { return child(/*parents_scope_open=*/false); });
        }
        std::_Exit(failed);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace

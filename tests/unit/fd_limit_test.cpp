// The descriptor limit (src/common/fd_limit.h): the soft limit raised to the
// hard one, and a shortage named as such, with the limit.
#include <sys/resource.h>

#include <cerrno>
#include <string>

#include <gtest/gtest.h>

#include "common/fd_limit.h"

namespace {

TEST(FdLimit, SoftRaisedToHard) {
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max != RLIM_INFINITY && original.rlim_max <= 64) GTEST_SKIP() << "hard limit too low to lower";
  rlimit low = original;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const long now = zero::raise_fd_limit();
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, original.rlim_max);
  if (original.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(now, static_cast<long>(original.rlim_max));
  }
  setrlimit(RLIMIT_NOFILE, &original);
}

TEST(FdLimit, ShortageNamedWithTheLimit) {
  EXPECT_TRUE(zero::is_fd_shortage(EMFILE));
  EXPECT_TRUE(zero::is_fd_shortage(ENFILE));
  EXPECT_FALSE(zero::is_fd_shortage(ENOENT));
  rlimit r{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
  const std::string msg = zero::out_of_descriptors("cannot open /proc/1/fd/3", EMFILE);
  const std::string limit = r.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(r.rlim_cur);
  EXPECT_EQ(msg.rfind("out of file descriptors (ulimit -n " + limit + "): cannot open /proc/1/fd/3: ", 0), 0u) << msg;
}

}  // namespace

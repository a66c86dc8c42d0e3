// A peer's exit as the shm lanes see it (src/comm/shm/process_watch.h): a
// live process is never taken for dead -- not even when this process has
// no descriptor to spare -- and an exit is seen while the process is a
// zombie (with a pidfd) or once it is reaped.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/shm/process_watch.h"

namespace {

using zero::comm::shm::ProcessWatch;

// A child that lives until its pipe closes, then exits.
pid_t child_until_closed(int* write_end) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[1]);
    char c;
    while (read(fds[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(fds[0]);
  *write_end = fds[1];
  return pid;
}

// Polls `w` until it sees the exit (the child needs a moment to go).
bool sees_exit(ProcessWatch& w, pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (w.exited(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

TEST(ProcessWatch, SeesAZombieAndAReapedProcess) {
  int pipe_end = -1;
  const pid_t pid = child_until_closed(&pipe_end);
  ASSERT_GT(pid, 0);
  ProcessWatch w;
  EXPECT_FALSE(w.exited(pid));
  close(pipe_end);
  EXPECT_TRUE(sees_exit(w, pid)) << "a zombie: exited, not yet reaped";
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(w.exited(pid));
  ProcessWatch late;
  EXPECT_TRUE(late.exited(pid)) << "reaped before the first question";
}

// At the descriptor limit: no pidfd, and yet no false exit.
TEST(ProcessWatch, AtTheDescriptorLimitALiveProcessIsAlive) {
  int pipe_end = -1;
  const pid_t pid = child_until_closed(&pipe_end);
  ASSERT_GT(pid, 0);
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  std::vector<int> filler;  // every descriptor under a limit of 64 taken
  rlimit low = original;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int fd; (fd = dup(0)) >= 0;) filler.push_back(fd);
  ProcessWatch w;
  const bool alive_seen_dead = w.exited(pid);
  close(pipe_end);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool reaped_seen = w.exited(pid);
  for (int fd : filler) close(fd);
  setrlimit(RLIMIT_NOFILE, &original);
  EXPECT_FALSE(alive_seen_dead);
  EXPECT_TRUE(reaped_seen);
}

}  // namespace

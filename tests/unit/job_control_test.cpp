// The agents' job control on loopback: two JobControls in one process, and
// strangers on node 0's port (a bare connect, garbage, forged lines).
#include "launch/job_control.h"

#include <arpa/inet.h>
#include <cstdint>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace {

using zero::launch::JobControl;
using namespace std::chrono_literals;

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::unique_ptr<JobControl> node(int rank, int port, const std::string& secret = "s3cret") {
  return std::make_unique<JobControl>(2, rank, "127.0.0.1", port, rank == 0 ? "ha" : "hb", secret,
                                      std::chrono::seconds(5));
}

// Connects to 127.0.0.1:port, sends `text`, and closes (or keeps it open: the fd).
int stranger(int port, const std::string& text, bool keep = false) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  if (!text.empty()) {
    EXPECT_EQ(send(fd, text.data(), text.size(), MSG_NOSIGNAL), ssize_t(text.size()));
  }
  if (keep) return fd;
  close(fd);
  return -1;
}

// Polls the nodes for `how_long`; the first stop reason any gives.
std::optional<std::string> run_for(std::chrono::milliseconds how_long, std::initializer_list<JobControl*> nodes) {
  const auto end = std::chrono::steady_clock::now() + how_long;
  while (std::chrono::steady_clock::now() < end) {
    for (auto* n : nodes)
      if (auto r = n->poll()) return r;
    std::this_thread::sleep_for(5ms);
  }
  return std::nullopt;
}

// Polls until node 0 has every other node's DONE (or 5 s).
bool finish(JobControl& n0, JobControl& n1) {
  n1.report_done();
  for (int i = 0; i < 1000 && !(n0.others_done() && n1.others_done()); ++i) {
    EXPECT_EQ(n0.poll(), std::nullopt);
    EXPECT_EQ(n1.poll(), std::nullopt);
    std::this_thread::sleep_for(5ms);
  }
  return n0.others_done() && n1.others_done();
}

TEST(JobControl, TwoNodesFinishTogether) {
  const int port = free_port();
  auto n0 = node(0, port);
  auto n1 = node(1, port);
  EXPECT_EQ(run_for(200ms, {n0.get(), n1.get()}), std::nullopt);
  EXPECT_FALSE(n0->others_done());
  EXPECT_TRUE(finish(*n0, *n1));
}

TEST(JobControl, StrangersChangeNothing) {
  const int port = free_port();
  auto n0 = node(0, port);
  const int silent = stranger(port, "", /*keep=*/true);
  stranger(port, "");                                                 // a bare connect and close
  stranger(port, std::string("GET / HTTP/1.0\r\n\r\n\0\xff\n", 21));  // garbage
  stranger(port, "STOP forged\n");                                    // forged lines
  stranger(port, "DONE\nDONE\n");
  stranger(port, "HELLO 1 forged\nDONE\nSTOP forged\n");
  stranger(port, "HELLO 1 0000 0000 forged\nDONE\n");
  stranger(port, std::string(100000, 'x'));  // a line too long
  EXPECT_EQ(run_for(300ms, {n0.get()}), std::nullopt);
  EXPECT_FALSE(n0->others_done());
  // The real node 1 still joins, and the job ends as usual.
  auto n1 = node(1, port);
  EXPECT_EQ(run_for(200ms, {n0.get(), n1.get()}), std::nullopt);
  EXPECT_TRUE(finish(*n0, *n1));
  close(silent);
}

TEST(JobControl, ALostNodeStopsTheOthers) {
  const int port = free_port();
  auto n0 = node(0, port);
  auto n1 = node(1, port);
  EXPECT_EQ(run_for(200ms, {n0.get(), n1.get()}), std::nullopt);
  n1.reset();  // its agent is gone
  const auto why = run_for(1000ms, {n0.get()});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("node 1 (host hb) was lost"), std::string::npos) << *why;
}

TEST(JobControl, AFailureOnANodeReachesNodeZero) {
  const int port = free_port();
  auto n0 = node(0, port);
  auto n1 = node(1, port);
  EXPECT_EQ(run_for(200ms, {n0.get(), n1.get()}), std::nullopt);
  n1->report_failure("host hb: rank 3 exited with code 5");
  const auto why = run_for(1000ms, {n0.get()});
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "host hb: rank 3 exited with code 5");
}

TEST(JobControl, ANodeWithAnotherSecretIsRefused) {
  const int port = free_port();
  auto n0 = node(0, port, "this job");
  auto n1 = node(1, port, "another job");
  std::optional<std::string> why;
  for (int i = 0; i < 400 && !why; ++i) {
    EXPECT_EQ(n0->poll(), std::nullopt);  // node 0 ignores it
    why = n1->poll();
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("ZERO_JOB_SECRET"), std::string::npos) << *why;
  EXPECT_FALSE(n0->others_done());
}

TEST(JobControl, NodeZeroChoosesItsPortWhenAskedTo) {
  auto n0 = std::make_unique<JobControl>(2, 0, "127.0.0.1", 0, "ha", "s", std::chrono::seconds(5));
  ASSERT_GT(n0->port(), 0);
  auto n1 = node(1, n0->port(), "s");
  EXPECT_EQ(run_for(200ms, {n0.get(), n1.get()}), std::nullopt);
  EXPECT_TRUE(finish(*n0, *n1));
}

// A node whose ranks are done before it reached node 0 stays until node 0
// has its DONE (else node 0 would wait for it for ever).
TEST(JobControl, DoneIsDeliveredBeforeANodeLeaves) {
  const int port = free_port();
  auto n1 = node(1, port);
  n1->report_done();
  EXPECT_EQ(n1->poll(), std::nullopt);
  EXPECT_FALSE(n1->others_done());
  auto n0 = node(0, port);
  EXPECT_TRUE(finish(*n0, *n1));
}

// A node that goes silent without closing its connection (a cut link, a
// frozen host): node 0 names it within the heartbeat timeout, and says it
// lost contact (the agent exits as a follower, naming that host).
TEST(JobControl, ASilentNodeIsNamedByTheHeartbeat) {
  // A timeout of 2.5 beats (JobControl::kBeatEvery, 1 s): one equal to the
  // beat's period failed under a loaded ctest when a beat came a few ms late.
  const int port = free_port();
  auto n0 = std::make_unique<JobControl>(2, 0, "127.0.0.1", port, "ha", "s", std::chrono::seconds(5), 2500ms);
  auto n1 = std::make_unique<JobControl>(2, 1, "127.0.0.1", port, "hb", "s", std::chrono::seconds(5), 2500ms);
  // Both beat: 5.5 s (over twice the timeout) pass without a stop.
  EXPECT_EQ(run_for(5500ms, {n0.get(), n1.get()}), std::nullopt);
  EXPECT_FALSE(n0->lost_contact());
  // Node 1 stops answering (its connection stays open).
  const auto t0 = std::chrono::steady_clock::now();
  const auto why = run_for(8000ms, {n0.get()});
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("host ha: lost contact with host hb (node 1): nothing from its zero-run for 2.5 s"),
            std::string::npos)
      << *why;
  EXPECT_TRUE(n0->lost_contact());
  EXPECT_LT(took, 5500ms);  // the timeout after node 1's last BEAT (1 s ago at most), with room for load
}

// Node k names node 0 lost when it goes silent, later than node 0 would.
TEST(JobControl, ASilentNodeZeroIsNamedByNodeK) {
  const int port = free_port();
  auto n0 = std::make_unique<JobControl>(2, 0, "127.0.0.1", port, "ha", "s", std::chrono::seconds(5), 500ms);
  auto n1 = std::make_unique<JobControl>(2, 1, "127.0.0.1", port, "hb", "s", std::chrono::seconds(5), 500ms);
  EXPECT_EQ(run_for(300ms, {n0.get(), n1.get()}), std::nullopt);
  const auto t0 = std::chrono::steady_clock::now();
  const auto why = run_for(8000ms, {n1.get()});
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("host hb: lost contact with node 0's zero-run"), std::string::npos) << *why;
  EXPECT_TRUE(n1->lost_contact());
  EXPECT_GE(took, JobControl::kNodeKExtra);
}

}  // namespace

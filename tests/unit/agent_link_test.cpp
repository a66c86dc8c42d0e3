// The launcher -> agent setup on the agent's stdin: any argument survives,
// a closed stdin is told apart, and the launcher's end closing is seen.
#include "launch/agent_link.h"

#include <stdexcept>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <string>

namespace {

using namespace zero::launch;
using Clock = std::chrono::steady_clock;

struct Pipe {
  int fd[2];
  Pipe() { EXPECT_EQ(pipe(fd), 0); }
  ~Pipe() { close_write(), close(fd[0]); }
  void write_all(const std::string& s) { EXPECT_EQ(write(fd[1], s.data(), s.size()), ssize_t(s.size())); }
  void close_write() {
    if (fd[1] >= 0) close(fd[1]);
    fd[1] = -1;
  }
};

TEST(AgentLink, SetupCarriesAnyArgumentAndTheSecret) {
  const AgentSetup sent{std::string("s\0 e\ncret", 10),
                        {"--chdir", "/a b/c", "it's", "$(touch x)", "", "line\nbreak", std::string("\0\xff", 2)}};
  Pipe p;
  p.write_all(setup_message(sent) + ports_message(29500, 41234));
  LauncherLink link(p.fd[0]);
  const auto got = link.read_setup(Clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(got.secret, sent.secret);
  EXPECT_EQ(got.args, sent.args);
  EXPECT_EQ(link.read_ports(Clock::now() + std::chrono::seconds(5)), std::make_pair(29500, 41234));
  EXPECT_TRUE(link.alive());
  p.close_write();
  EXPECT_FALSE(link.alive());
}

TEST(AgentLink, TheSetupLinesHoldNoSpaceButTheirOwn) {
  // (nothing a shell or a pty would split or act on, whatever the arguments)
  const std::string m = setup_message({"k", {"a b", "c\td", "e;f"}});
  for (char c : m) EXPECT_TRUE(c == '\n' || c == ' ' || std::isalnum(static_cast<unsigned char>(c))) << int(c);
}

TEST(AgentLink, StdinClosedFirstIsNamed) {
  Pipe p;
  p.close_write();
  LauncherLink link(p.fd[0]);
  try {
    link.read_setup(Clock::now() + std::chrono::seconds(5));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("must pass stdin on"), std::string::npos) << e.what();
  }
}

TEST(AgentLink, GarbledAndLateSetupsAreErrors) {
  {
    Pipe p;
    p.write_all("HELLO\n");
    LauncherLink link(p.fd[0]);
    EXPECT_THROW(link.read_setup(Clock::now() + std::chrono::seconds(5)), std::runtime_error);
  }
  Pipe p;
  p.write_all("SECRET 00\n");  // and then nothing
  LauncherLink link(p.fd[0]);
  const auto t0 = Clock::now();
  EXPECT_THROW(link.read_setup(t0 + std::chrono::milliseconds(200)), std::runtime_error);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
}

TEST(AgentLink, PortsReport) {
  EXPECT_EQ(parse_ports_report(ports_report(29500, 1)), std::make_pair(29500, 1));
  EXPECT_EQ(parse_ports_report("ZERO-RUN-PORTS 1 2\r\n"), std::make_pair(1, 2));
  EXPECT_EQ(parse_ports_report("ZERO-RUN-PORTS 1 70000\n"), std::nullopt);
  EXPECT_EQ(parse_ports_report("[rank 0] ZERO-RUN-PORTS 1 2\n"), std::nullopt);
  EXPECT_EQ(parse_ports_report("ZERO-RUN-PORTS 1\n"), std::nullopt);
}

}  // namespace

// zero-run --hostfile: DeepSpeed's hostfile format and how a host's command is built.
#include "launch/hostfile.h"

#include <gtest/gtest.h>
#include <stdexcept>

namespace {

using zero::launch::on_host;
using zero::launch::parse_hostfile;

TEST(Hostfile, ReadsHostsAndSlotsInOrder) {
  const auto h = parse_hostfile("# two nodes\nworker-1 slots=4\n\n  worker-0 slots=2   # comment\n", "hf");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].host, "worker-1");
  EXPECT_EQ(h[0].slots, 4);
  EXPECT_EQ(h[1].host, "worker-0");
  EXPECT_EQ(h[1].slots, 2);
}

TEST(Hostfile, BadLinesAreNamed) {
  auto message = [](const std::string& text) {
    try {
      parse_hostfile(text, "hf");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("a slots=1\nb\n"), "hf:2: expected \"b slots=N\"");
  EXPECT_EQ(message("a slots=0\n"), "hf:1: slots must be an integer in [1, 1024], got '0'");
  EXPECT_EQ(message("a slots=2x\n"), "hf:1: slots must be an integer in [1, 1024], got '2x'");
  EXPECT_EQ(message("a slots=2 gpus=1\n"), "hf:1: unexpected 'gpus=1' after slots=2");
  EXPECT_EQ(message("a slots=1\na slots=2\n"), "hf:2: host a is listed twice");
  EXPECT_EQ(message("# nothing\n"), "hf: no host listed (expected lines \"HOST slots=N\")");
  EXPECT_EQ(message("a slots=1\n-oProxyCommand=x slots=1\n"),
            "hf:2: host name '-oProxyCommand=x' starts with '-' (it would be an option to --host-exec's command)");
  EXPECT_EQ(message("a;touch${IFS}x slots=1\n"),
            "hf:1: host name 'a;touch${IFS}x' holds characters a shell would split or act on");
  EXPECT_EQ(parse_hostfile("user@node-1.example slots=1\n10.0.0.2 slots=2\n", "hf").size(), 2u);
}

TEST(Hostfile, CommandOnAHostKeepsWordsOrQuotesThemForSsh) {
  const std::vector<std::string> argv{"/opt/zero run/zero-run", "--agent", "it's a b"};
  EXPECT_EQ(on_host("ssh -o BatchMode=yes {host}", "w1", argv),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "w1",
                                      "'/opt/zero run/zero-run' '--agent' 'it'\\''s a b'"}));
  EXPECT_EQ(on_host("/usr/bin/ssh user@{host}", "w1", {"a b"}),
            (std::vector<std::string>{"/usr/bin/ssh", "user@w1", "'a b'"}));
  // Not ssh: the words as they are, when a shell would leave them so.
  EXPECT_EQ(on_host("ip netns exec {host}", "ns1", {"/opt/zero-cpp/bin/zero-run", "--agent"}),
            (std::vector<std::string>{"ip", "netns", "exec", "ns1", "/opt/zero-cpp/bin/zero-run", "--agent"}));
  for (const std::string bad : {"it's a b", "a b", "$(x)", "a;b", "*", "~", "", "a\nb", "`x`", "a|b", "a&b", ">x"})
    EXPECT_THROW(on_host("pdsh -w {host}", "w1", {"/bin/zero-run", bad}), std::invalid_argument) << bad;
}

TEST(Hostfile, ShellInertWords) {
  EXPECT_TRUE(zero::launch::shell_inert("/work/build-1/zero_run.v2,x:y=z@h%+"));
  EXPECT_FALSE(zero::launch::shell_inert("a'b"));
  EXPECT_FALSE(zero::launch::shell_inert("a\"b"));
  EXPECT_FALSE(zero::launch::shell_inert("a\\b"));
  EXPECT_FALSE(zero::launch::shell_inert("{a,b}"));
  EXPECT_FALSE(zero::launch::shell_inert("a#b"));
  EXPECT_FALSE(zero::launch::shell_inert("[ab]"));
}

}  // namespace

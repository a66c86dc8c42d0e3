// The agents' handshake on its own: each side's proof checks out under the
// same secret and fails under another, for another connection's nonces, or
// for the other side's text.
#include "launch/handshake.h"

#include <gtest/gtest.h>

namespace {

using namespace zero::launch;

TEST(Handshake, BothSidesProveTheSameSecret) {
  const std::string n0 = fresh_nonce(), nk = fresh_nonce();
  EXPECT_EQ(parse_challenge(challenge_line(n0)), n0);
  const auto hello = parse_hello(hello_line("s", n0, 1, nk, "host-b"));
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->node, "1");
  EXPECT_EQ(hello->nonce, nk);
  EXPECT_EQ(hello->host, "host-b");
  EXPECT_TRUE(hello_proves("s", n0, *hello));
  EXPECT_TRUE(welcome_proves("s", n0, 1, nk, welcome_line("s", n0, *hello)));
}

TEST(Handshake, ProofsFailUnderAnotherSecretOrConnection) {
  const std::string n0 = fresh_nonce(), nk = fresh_nonce();
  const auto hello = parse_hello(hello_line("s", n0, 1, nk, "b"));
  ASSERT_TRUE(hello);
  EXPECT_FALSE(hello_proves("t", n0, *hello));             // another secret
  EXPECT_FALSE(hello_proves("s", fresh_nonce(), *hello));  // replayed on another connection
  Hello as_node_2 = *hello;
  as_node_2.node = "2";
  EXPECT_FALSE(hello_proves("s", n0, as_node_2));  // the node is part of the proof
  const std::string welcome = welcome_line("s", n0, *hello);
  EXPECT_FALSE(welcome_proves("t", n0, 1, nk, welcome));
  EXPECT_FALSE(welcome_proves("s", n0, 1, fresh_nonce(), welcome));
  EXPECT_FALSE(welcome_proves("s", n0, 2, nk, welcome));
  // A HELLO's proof is no WELCOME (the texts differ), whatever is echoed.
  EXPECT_FALSE(welcome_proves("s", n0, 1, nk, "WELCOME " + hello->proof));
}

TEST(Handshake, MalformedLinesAreNoHandshake) {
  for (const std::string line : {"", "HELLO", "HELLO 1 a b", "HELLO 1 a b ", "HELLO  a b c", "hello 1 a b c"})
    EXPECT_FALSE(parse_hello(line)) << line;
  for (const std::string line : {"CHALLENGE", "CHALLENGE ", "CHALLENGE a b", "STOP x"})
    EXPECT_FALSE(parse_challenge(line)) << line;
  EXPECT_FALSE(welcome_proves("s", "a", 1, "b", "STOP x"));
}

}  // namespace

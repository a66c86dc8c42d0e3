// The agents' proofs: SHA-256 (FIPS 180-4's examples) and HMAC-SHA-256
// (RFC 4231's test cases 1, 2 and 6), hex, and the constant-time comparison.
// The digests come from OpenSSL's libcrypto; the vectors check it is wired
// right (the digest named, a key longer than a block, lengths passed).
#include "launch/secret.h"

#include <gtest/gtest.h>
#include <stdexcept>

namespace {

using namespace zero::launch;

std::string hex_of(const std::array<uint8_t, 32>& d) { return to_hex(std::string(d.begin(), d.end())); }

TEST(Secret, Sha256OfTheStandardsExamples) {
  EXPECT_EQ(hex_of(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_of(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Secret, HmacSha256OfRfc4231) {
  EXPECT_EQ(proof(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(proof("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(proof(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Secret, HexBothWaysAndRandom) {
  EXPECT_EQ(to_hex(std::string("\x00\x7f\xff", 3)), "007fff");
  EXPECT_EQ(from_hex("007fFF"), std::string("\x00\x7f\xff", 3));
  EXPECT_THROW(from_hex("abc"), std::invalid_argument);
  EXPECT_THROW(from_hex("zz"), std::invalid_argument);
  const std::string a = random_hex(16), b = random_hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

TEST(Secret, ConstantTimeEquality) {
  EXPECT_TRUE(equal_in_constant_time("", ""));
  EXPECT_TRUE(equal_in_constant_time("abc", "abc"));
  EXPECT_FALSE(equal_in_constant_time("abc", "abd"));
  EXPECT_FALSE(equal_in_constant_time("abc", "xbc"));
  EXPECT_FALSE(equal_in_constant_time("abc", "abcd"));
}

}  // namespace

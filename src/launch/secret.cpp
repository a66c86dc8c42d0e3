#include "launch/secret.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <stdexcept>

namespace zero::launch {

namespace {

[[noreturn]] void fail(const char* what) {
  char reason[256] = "unknown error";
  if (const unsigned long e = ERR_get_error()) ERR_error_string_n(e, reason, sizeof reason);
  ERR_clear_error();
  throw std::runtime_error(std::string(what) + ": " + reason);
}

}  // namespace

std::array<uint8_t, 32> sha256(const std::string& data) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  if (!EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) || len != out.size())
    fail("SHA-256 failed");
  return out;
}

std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message) {
  if (key.size() > static_cast<size_t>(INT_MAX)) throw std::invalid_argument("HMAC key too long");
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len) ||
      len != out.size())
    fail("HMAC-SHA-256 failed");
  return out;
}

std::string proof(const std::string& key, const std::string& message) {
  const auto d = hmac_sha256(key, message);
  return to_hex(std::string(d.begin(), d.end()));
}

std::string random_hex(size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX)) throw std::invalid_argument("too many random bytes asked for");
  std::string buf(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(buf.data()), static_cast<int>(bytes)) != 1)
    fail("cannot get random bytes");
  return to_hex(buf);
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += digits[c >> 4], out += digits[c & 15];
  return out;
}

std::string from_hex(const std::string& hex) {
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2) throw std::invalid_argument("odd count of hex digits");
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = value(hex[i]), lo = value(hex[i + 1]);
    if (hi < 0 || lo < 0) throw std::invalid_argument("not a hex digit in '" + hex.substr(i, 2) + "'");
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

bool equal_in_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace zero::launch

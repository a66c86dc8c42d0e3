// The job's secret and the proofs built on it, for zero-run's agents
// (launch/job_control.h): SHA-256 and HMAC-SHA-256, random nonces, and a
// comparison whose time does not depend on where two strings differ, all
// from OpenSSL's libcrypto (tests/unit/secret_test.cpp checks it is wired
// right against FIPS 180-4's and RFC 4231's vectors). Only secret.cpp
// includes OpenSSL's headers.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace zero::launch {

// The variable that carries a job's secret to zero-run (never its command line).
inline constexpr const char* kSecretVariable = "ZERO_JOB_SECRET";

std::array<uint8_t, 32> sha256(const std::string& data);
std::array<uint8_t, 32> hmac_sha256(const std::string& key, const std::string& message);
// HMAC-SHA-256 of `message` under `key`, in lower-case hex (64 characters).
std::string proof(const std::string& key, const std::string& message);

// `bytes` random bytes from OpenSSL's CSPRNG (RAND_bytes, seeded by the kernel), in hex.
// Throws when none can be had.
std::string random_hex(size_t bytes);

std::string to_hex(const std::string& bytes);
// Throws std::invalid_argument on anything but an even count of hex digits.
std::string from_hex(const std::string& hex);

// a == b, taking the same time wherever they differ (a length difference,
// not secret here, returns at once).
bool equal_in_constant_time(const std::string& a, const std::string& b);

}  // namespace zero::launch

// How two zero-run agents of one job prove to each other that they hold
// the job's secret (launch/secret.h) before either's word counts
// (launch/job_control.h), a line each:
//   node 0 -> k:  CHALLENGE <n0>
//   node k -> 0:  HELLO <node> <nk> <proof> <host>
//                 proof = HMAC-SHA-256(secret, "zero-run hello n0 node nk host")
//   node 0 -> k:  WELCOME <proof>
//                 proof = HMAC-SHA-256(secret, "zero-run welcome nk n0 node")
//             or  REFUSED <why>
// n0 and nk are fresh random nonces, one per connection: a proof overheard
// on one connection proves nothing on another, and neither side can be
// made to answer its own challenge (the two texts differ). The secret
// itself never crosses the wire. This proves who is at the other end of a
// connection, not each line after it: it keeps out strangers that reach the
// port (a scan, another job), not someone who can sit in the path between
// the hosts (nothing here is encrypted).
#pragma once

#include <optional>
#include <string>

namespace zero::launch {

struct Hello {
  std::string node;  // as sent: node 0 checks that it is one of the job's
  std::string nonce;
  std::string proof;
  std::string host;
};

// A fresh nonce (random, hex) for a CHALLENGE or a HELLO.
std::string fresh_nonce();

std::string challenge_line(const std::string& challenge);
// CHALLENGE's nonce, or nothing if `line` is not a CHALLENGE.
std::optional<std::string> parse_challenge(const std::string& line);

// Node k's answer to `challenge`, proving `secret`.
std::string hello_line(const std::string& secret, const std::string& challenge, int node, const std::string& nonce,
                       const std::string& host);
// HELLO's fields, or nothing if `line` is not a well-formed HELLO.
std::optional<Hello> parse_hello(const std::string& line);
// Whether `hello` answers `challenge` under `secret` (in constant time).
bool hello_proves(const std::string& secret, const std::string& challenge, const Hello& hello);

// Node 0's answer to a HELLO that proved the secret, proving it back.
std::string welcome_line(const std::string& secret, const std::string& challenge, const Hello& hello);
// Whether `line` is the WELCOME that node 0 holding `secret` sends to node
// `node`'s HELLO with `nonce` on `challenge` (in constant time).
bool welcome_proves(const std::string& secret, const std::string& challenge, int node, const std::string& nonce,
                    const std::string& line);

}  // namespace zero::launch

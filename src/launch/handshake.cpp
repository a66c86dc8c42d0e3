#include "launch/handshake.h"

#include "launch/secret.h"

namespace zero::launch {

namespace {

constexpr size_t kNonceBytes = 16;

std::string hello_text(const std::string& challenge, const std::string& node, const std::string& nonce,
                       const std::string& host) {
  return "zero-run hello " + challenge + " " + node + " " + nonce + " " + host;
}

std::string welcome_text(const std::string& nonce, const std::string& challenge, const std::string& node) {
  return "zero-run welcome " + nonce + " " + challenge + " " + node;
}

}  // namespace

std::string fresh_nonce() { return random_hex(kNonceBytes); }

std::string challenge_line(const std::string& challenge) { return "CHALLENGE " + challenge; }

std::optional<std::string> parse_challenge(const std::string& line) {
  constexpr size_t kWord = sizeof("CHALLENGE ") - 1;
  if (line.rfind("CHALLENGE ", 0) != 0 || line.size() == kWord || line.find(' ', kWord) != std::string::npos)
    return std::nullopt;
  return line.substr(kWord);
}

std::string hello_line(const std::string& secret, const std::string& challenge, int node, const std::string& nonce,
                       const std::string& host) {
  const std::string n = std::to_string(node);
  return "HELLO " + n + " " + nonce + " " + proof(secret, hello_text(challenge, n, nonce, host)) + " " + host;
}

std::optional<Hello> parse_hello(const std::string& line) {
  if (line.rfind("HELLO ", 0) != 0) return std::nullopt;
  Hello h;
  std::string* fields[] = {&h.node, &h.nonce, &h.proof};
  size_t at = 6;
  for (std::string* f : fields) {
    const size_t sp = line.find(' ', at);
    if (sp == std::string::npos || sp == at) return std::nullopt;
    *f = line.substr(at, sp - at);
    at = sp + 1;
  }
  h.host = line.substr(at);
  if (h.host.empty()) return std::nullopt;
  return h;
}

bool hello_proves(const std::string& secret, const std::string& challenge, const Hello& hello) {
  return equal_in_constant_time(hello.proof, proof(secret, hello_text(challenge, hello.node, hello.nonce, hello.host)));
}

std::string welcome_line(const std::string& secret, const std::string& challenge, const Hello& hello) {
  return "WELCOME " + proof(secret, welcome_text(hello.nonce, challenge, hello.node));
}

bool welcome_proves(const std::string& secret, const std::string& challenge, int node, const std::string& nonce,
                    const std::string& line) {
  if (line.rfind("WELCOME ", 0) != 0) return false;
  return equal_in_constant_time(line.substr(8), proof(secret, welcome_text(nonce, challenge, std::to_string(node))));
}

}  // namespace zero::launch

#include "launch/agent_link.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include "launch/secret.h"

namespace zero::launch {

namespace {

constexpr const char* kPortsReport = "ZERO-RUN-PORTS ";

// "<int> <int>" with both in [1, 65535], or nothing.
std::optional<std::pair<int, int>> two_ports(const std::string& s) {
  char* end = nullptr;
  const long a = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != ' ') return std::nullopt;
  const char* second = end + 1;
  const long b = std::strtol(second, &end, 10);
  while (*end == '\r' || *end == '\n') ++end;
  if (end == second || *end || a < 1 || a > 65535 || b < 1 || b > 65535) return std::nullopt;
  return std::make_pair(static_cast<int>(a), static_cast<int>(b));
}

}  // namespace

std::string setup_message(const AgentSetup& setup) {
  std::string out = "SECRET " + to_hex(setup.secret) + "\n";
  for (const auto& a : setup.args) out += "ARG " + to_hex(a) + "\n";
  return out + "GO\n";
}

std::string ports_message(int rendezvous, int agents) {
  return "PORTS " + std::to_string(rendezvous) + " " + std::to_string(agents) + "\n";
}

std::string ports_report(int rendezvous, int agents) {
  return kPortsReport + std::to_string(rendezvous) + " " + std::to_string(agents) + "\n";
}

std::optional<std::pair<int, int>> parse_ports_report(const std::string& line) {
  if (line.rfind(kPortsReport, 0) != 0) return std::nullopt;
  return two_ports(line.substr(std::string(kPortsReport).size()));
}

std::optional<std::string> LauncherLink::line(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string l = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (!l.empty() && l.back() == '\r') l.pop_back();
      return l;
    }
    if (eof_) return std::nullopt;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("nothing came from the launcher on stdin in time");
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) eof_ = true;
    else buffer_.append(buf, static_cast<size_t>(n));
  }
}

AgentSetup LauncherLink::read_setup(std::chrono::steady_clock::time_point deadline) {
  AgentSetup setup;
  bool secret = false;
  for (;;) {
    const auto l = line(deadline);
    if (!l)
      throw std::runtime_error(
          "stdin closed before the launcher's setup came: the --host-exec command must pass stdin on "
          "(no ssh -n), as zero-run --hostfile sends the agent its job there");
    try {
      if (l->rfind("SECRET ", 0) == 0) {
        setup.secret = from_hex(l->substr(7));
        secret = true;
      } else if (l->rfind("ARG ", 0) == 0) {
        setup.args.push_back(from_hex(l->substr(4)));
      } else if (*l == "GO") {
        if (!secret) throw std::invalid_argument("no SECRET before GO");
        return setup;
      } else {
        throw std::invalid_argument("an unexpected line");
      }
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("the launcher's setup on stdin is garbled (" + std::string(e.what()) +
                               "): is this "
                               "agent started by zero-run --hostfile, of the same version?");
    }
  }
}

std::pair<int, int> LauncherLink::read_ports(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto l = line(deadline);
    if (!l) throw std::runtime_error("stdin closed before the launcher said node 0's ports: the launcher is gone");
    if (l->rfind("PORTS ", 0) == 0)
      if (auto ports = two_ports(l->substr(6))) return *ports;
    throw std::runtime_error("the launcher said '" + l->substr(0, 40) + "' where node 0's ports were due");
  }
}

bool LauncherLink::alive() {
  while (!eof_) {
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (p.revents & POLLNVAL) {
      eof_ = true;
      break;
    }
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof(buf));  // nothing more is expected: dropped
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) eof_ = true;
  }
  return !eof_;
}

}  // namespace zero::launch

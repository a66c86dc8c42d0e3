#include "common/fault_injection.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace zero::fault {

namespace {

constexpr const char* kPoints[] = {"forward", "backward", "step", "save", "load"};
constexpr int kNumPoints = sizeof(kPoints) / sizeof(kPoints[0]);

struct Plan {
  bool active = false;  // ZERO_FAULT names this process
  int point = -1;       // index into kPoints
  std::string kind;     // kill, throw, exit
  long nth = 1;
  std::string spec;
};

int point_index(const char* name) {
  for (int i = 0; i < kNumPoints; ++i)
    if (std::strcmp(kPoints[i], name) == 0) return i;
  return -1;
}

Plan parse() {
  Plan p;
  const char* v = std::getenv("ZERO_FAULT");
  if (!v || !*v) return p;
  p.spec = v;
  std::vector<std::string> f;
  for (size_t start = 0;;) {
    const size_t colon = p.spec.find(':', start);
    f.push_back(p.spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  auto number = [](const std::string& s, long min) {
    char* end = nullptr;
    const long x = std::strtol(s.c_str(), &end, 10);
    return !s.empty() && *end == 0 && x >= min ? x : -1;
  };
  const bool shape = f.size() == 3 || f.size() == 4;
  const long rank = shape ? number(f[0], 0) : -1;
  p.point = shape ? point_index(f[1].c_str()) : -1;
  p.kind = shape ? f[2] : "";
  p.nth = f.size() == 4 ? number(f[3], 1) : 1;
  if (rank < 0 || p.point < 0 || p.nth < 1 || (p.kind != "kill" && p.kind != "throw" && p.kind != "exit"))
    throw std::invalid_argument("ZERO_FAULT='" + p.spec +
                                "' is not <rank>:<point>:<kind>[:<nth>] with a point of forward, backward, step, "
                                "save or load and a kind of kill, throw or exit (a test-only setting)");
  const char* r = std::getenv("RANK");
  p.active = r && std::strtol(r, nullptr, 10) == rank;
  return p;
}

const Plan& plan() {
  static const Plan p = parse();
  return p;
}

std::atomic<long> g_passes[kNumPoints];

}  // namespace

bool armed(const char* name) {
  const Plan& p = plan();
  return p.active && p.point == point_index(name);
}

void point(const char* name) {
  if (!armed(name)) return;
  const Plan& p = plan();
  const long pass = ++g_passes[p.point];
  if (pass != p.nth) return;
  const double t = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "zero-fault: rank %s: %s at %s #%ld (unix time %.6f)\n", std::getenv("RANK"), p.kind.c_str(),
               name, pass, t);
  std::fflush(stderr);
  if (p.kind == "kill") std::raise(SIGKILL);
  if (p.kind == "exit") std::exit(3);
  throw std::runtime_error("injected fault: " + p.kind + " at " + name + " #" + std::to_string(pass) +
                           " (ZERO_FAULT=" + p.spec + ")");
}

}  // namespace zero::fault

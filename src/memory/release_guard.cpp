#include "memory/release_guard.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace zero::memory {

namespace {

struct Region {
  uintptr_t begin = 0, end = 0;
  std::vector<NamedRange> ranges;  // sorted by offset
  std::string advice;
};

// A fixed table the signal handler can scan without locks or allocation.
constexpr int kSlots = 4096;
std::atomic<Region*> g_slots[kSlots];
std::mutex g_install_mu;
// Unregistered regions are freed only after many later unregistrations, so
// a handler still scanning one on another thread never reads freed memory.
constexpr size_t kRetired = 256;
std::mutex g_retire_mu;
Region* g_retired[kRetired];
size_t g_next_retired = 0;
bool g_installed = false;
struct sigaction g_previous;
std::atomic<const char*> g_note{nullptr};  // set_released_access_note's, never freed

void say(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void chain(int sig, siginfo_t* info, void* ctx) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    return g_previous.sa_handler(sig);
  }
  // The default action: a fault re-runs its instruction and faults again
  // without us; a signal sent by kill() must be raised again.
  signal(sig, SIG_DFL);
  if (info->si_code <= 0) raise(sig);
}

void on_segv(int sig, siginfo_t* info, void* ctx) {
  // Ours: an access to an inaccessible (released) page of a registered region.
  const auto addr = info->si_code == SEGV_ACCERR ? reinterpret_cast<uintptr_t>(info->si_addr) : 0;
  for (auto& slot : g_slots) {
    const Region* r = slot.load(std::memory_order_acquire);
    if (!r || addr < r->begin || addr >= r->end) continue;
    const size_t off = addr - r->begin;
    const char* what = "the padding of a stage-3 flat buffer";
    for (const auto& nr : r->ranges)
      if (off >= nr.offset && off < nr.offset + nr.bytes) what = nr.name.c_str();
    say("zero-cpp: fatal: ");
    say(what);
    say(" was read or written while released: ");
    say(r->advice.c_str());
    if (const char* note = g_note.load(std::memory_order_acquire)) {
      say(" ");
      say(note);
    }
    say("\n");
    signal(sig, SIG_DFL);  // returning re-runs the access, which now ends the process
    return;
  }
  chain(sig, info, ctx);
}

void install_once() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  if (g_installed) return;
  struct sigaction sa {};
  sa.sa_sigaction = &on_segv;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, &g_previous);
  g_installed = true;
}

}  // namespace

void set_released_access_note(std::string note) {
  // Leaked on purpose: the signal handler may read it at any time, to the end.
  g_note.store((new std::string(std::move(note)))->c_str(), std::memory_order_release);
}

int register_released_region(const void* base, size_t bytes, std::vector<NamedRange> ranges, std::string advice) {
  install_once();
  auto* r = new Region;
  r->begin = reinterpret_cast<uintptr_t>(base);
  r->end = r->begin + bytes;
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  r->ranges = std::move(ranges);
  r->advice = std::move(advice);
  for (int i = 0; i < kSlots; ++i) {
    Region* expected = nullptr;
    if (g_slots[i].compare_exchange_strong(expected, r, std::memory_order_acq_rel)) return i;
  }
  delete r;  // table full: faults there stay bare segfaults
  return -1;
}

void unregister_released_region(int id) {
  if (id < 0 || id >= kSlots) return;
  Region* r = g_slots[id].exchange(nullptr, std::memory_order_acq_rel);
  if (!r) return;
  std::lock_guard<std::mutex> lock(g_retire_mu);
  Region*& slot = g_retired[g_next_retired++ % kRetired];
  delete slot;
  slot = r;
}

}  // namespace zero::memory

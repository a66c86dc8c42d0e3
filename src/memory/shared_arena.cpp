#include "memory/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/fd_limit.h"

namespace zero::memory {

namespace {

struct Arena {
  std::mutex mu;
  pid_t pid = 0;  // whose: a forked child starts its own
  int fd = -1;
  uint64_t inode = 0;
  bool unavailable = false;              // no memfd on this system: buffers are private
  int64_t end = 0;                       // the memfd's size
  std::multimap<size_t, int64_t> freed;  // punched ranges by size, to reuse
  // KeepFreedSharedPages: freed ranges still holding their pages and
  // mapping, least recently freed first, and the bound they are kept under.
  int keep_scopes = 0;
  pid_t scope_pid = 0;  // the process whose scopes they are: a forked child inherits its parent's count
  std::deque<SharedRange> kept;
  size_t kept_bytes = 0;
  size_t live_bytes = 0;  // in ranges mapped and not freed
  size_t peak_bytes = 0;  // the most live since the outermost scope began
  size_t fresh_bytes = 0;  // mapped afresh (no kept range of their size) since then
  // The sizes the scope asked for (mapped afresh or taken kept) and the
  // largest: the next scope will ask for them again before it frees any, so
  // its end carries one range of each. (Sizes mapped afresh alone would
  // carry a size every other scope: the scope that takes a carried range
  // maps none of its size.)
  std::set<size_t> carry_sizes;
  size_t largest_carry_size = 0;
  uint64_t kept_reuses = 0;
  KeptBytesObserver observer = nullptr;
};

// Never destroyed: buffers are freed during exit too.
Arena& arena() {
  static auto* a = new Arena;
  return *a;
}

// How far past the peak kept ranges may take the arena's bytes before a
// fresh range punches them: a grad buffer smaller than those kept (a root
// unit's, first in a backward) does not cost one kept for the next of its size.
// As the CPU allocator's cache's (memory/cpu_allocator.h kLargeBlockSlackBytes).
constexpr size_t kKeptPagesSlackBytes = size_t{32} << 20;

size_t page_rounded(size_t bytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

[[noreturn]] void out_of_memory(size_t bytes, int err) {
  throw std::runtime_error("zero-cpp: out of memory allocating a " + std::to_string(bytes >> 20) +
                           " MiB shared flat buffer: " + std::strerror(err));
}

// The arena's memfd, made at the first shared buffer of this process; false
// where the system has none. Called with the lock held.
bool ensure_memfd(Arena& a) {
  if (a.pid != getpid()) {  // first use, or a forked child, whose descriptor is its parent's arena
    // A child's descriptor stays open: its copies of the parent's buffers
    // name it, and a number reused for another file would misdirect them.
    a.fd = -1;
    a.inode = 0;
    a.unavailable = false;
    a.end = 0;
    a.freed.clear();
    a.kept.clear();  // the parent's: its child frees none of them
    a.kept_bytes = a.live_bytes = a.peak_bytes = 0;
    // (A scope this process opened before its first buffer stays open: the
    // scopes are told apart by scope_pid, not by the arena's pid.)
    a.pid = getpid();
  }
  if (a.fd >= 0) return true;
  if (a.unavailable) return false;
  const int fd = memfd_create("zero-cpp-flat", MFD_CLOEXEC);
  if (fd < 0) {
    if (is_fd_shortage(errno))
      throw std::runtime_error("zero-cpp: " + out_of_descriptors("creating the memfd for shared flat buffers", errno));
    a.unavailable = true;  // ENOSYS, or forbidden: private buffers, staged collectives
    return false;
  }
  struct stat st {};
  fstat(fd, &st);
  a.fd = fd;
  a.inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

void note_kept(Arena& a, std::ptrdiff_t bytes) {
  if (a.observer) a.observer(bytes);
}

// Gives a kept range's pages back and lets its range be reused.
void punch_kept(Arena& a, const SharedRange& k) {
  munmap(k.ptr, k.bytes);
  a.kept_bytes -= k.bytes;
  note_kept(a, -static_cast<std::ptrdiff_t>(k.bytes));
  if (punch_shared_range(k)) a.freed.emplace(k.bytes, k.offset);
}

// In one of this process's scopes (not only in one a forked child inherited).
bool in_scope(const Arena& a) { return a.keep_scopes > 0 && a.scope_pid == getpid(); }

void note_carry_size(Arena& a, size_t bytes) {
  a.carry_sizes.insert(bytes);
  a.largest_carry_size = std::max(a.largest_carry_size, bytes);
}

}  // namespace

std::optional<SharedRange> take_kept_range(size_t bytes) {
  Arena& a = arena();
  std::unique_lock<std::mutex> lock(a.mu);
  if (!in_scope(a) || a.pid != getpid()) return std::nullopt;
  const size_t len = page_rounded(bytes);
  // The most recently freed of its size.
  const auto it = std::find_if(a.kept.rbegin(), a.kept.rend(), [&](const SharedRange& k) { return k.bytes == len; });
  if (it == a.kept.rend()) return std::nullopt;
  const SharedRange r = *it;
  a.kept.erase(std::next(it).base());
  a.kept_bytes -= len;
  note_carry_size(a, len);
  a.live_bytes += len;  // within the peak: it was in use before
  ++a.kept_reuses;
  lock.unlock();
  std::memset(r.ptr, 0, len);  // it holds the last buffer's bytes; a new one starts from zeros
  return r;
}

std::optional<SharedRange> map_shared_range(size_t bytes) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!ensure_memfd(a)) return std::nullopt;
  const size_t len = page_rounded(bytes);
  // In a scope, kept ranges make room first: in use, this one and those kept
  // within the most in use at once (which this one may raise) and the slack.
  // Outside one, the ranges carried from the last scope go: their memory is
  // wanted elsewhere.
  const size_t peak = std::max(a.peak_bytes, a.live_bytes + len);
  while (!a.kept.empty() &&
         (!in_scope(a) || a.live_bytes + len + a.kept_bytes > peak + kKeptPagesSlackBytes)) {
    punch_kept(a, a.kept.front());
    a.kept.pop_front();
  }
  int64_t offset;
  if (auto it = a.freed.find(len); it != a.freed.end()) {
    offset = it->second;
    a.freed.erase(it);
  } else {
    offset = a.end;
    if (ftruncate(a.fd, static_cast<off_t>(a.end + static_cast<int64_t>(len))) != 0) out_of_memory(bytes, errno);
    a.end += static_cast<int64_t>(len);
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    a.freed.emplace(len, offset);  // untouched: still a hole
    out_of_memory(bytes, err);
  }
  a.live_bytes += len;
  if (in_scope(a)) {
    a.peak_bytes = peak;
    a.fresh_bytes += len;
    note_carry_size(a, len);
  }
  return SharedRange{static_cast<char*>(p), len, offset, a.fd, a.inode, a.pid};
}

bool punch_shared_range(const SharedRange& r) {
  return fallocate(r.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
                   static_cast<off_t>(r.bytes)) == 0;
}

void free_shared_range(const SharedRange& r, bool resident) {
  Arena& a = arena();
  if (r.owner == getpid()) {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.pid == r.owner) {
      a.live_bytes -= r.bytes;
      if (in_scope(a) && resident) {
        a.kept.push_back(r);
        a.kept_bytes += r.bytes;
        note_kept(a, static_cast<std::ptrdiff_t>(r.bytes));
        return;
      }
    }
  }
  munmap(r.ptr, r.bytes);
  if (r.owner != getpid()) return;  // a forked child's copy of its parent's buffer
  std::lock_guard<std::mutex> lock(a.mu);
  // Reused only once its pages are gone: the next buffer starts zero-filled.
  if (a.pid == r.owner && punch_shared_range(r)) a.freed.emplace(r.bytes, r.offset);
}

namespace {

enum class KeepMode { On, WithinScope, Off };

KeepMode keep_mode() {
  static const KeepMode mode = [] {
    const char* v = std::getenv("ZERO_KEEP_FREED_PAGES");
    const std::string s = v ? v : "";
    if (s == "off") return KeepMode::Off;
    if (s == "within-scope") return KeepMode::WithinScope;
    if (!s.empty() && s != "on")
      throw std::invalid_argument("ZERO_KEEP_FREED_PAGES=" + s + ": expected on, within-scope or off");
    return KeepMode::On;
  }();
  return mode;
}

}  // namespace

bool keeping_freed_pages() { return keep_mode() != KeepMode::Off; }

KeepFreedSharedPages::KeepFreedSharedPages() {
  if (!keeping_freed_pages()) return;
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.scope_pid != getpid()) a.keep_scopes = 0;  // those a forked child inherited are not its own
  // Ranges carried from the last scope were in use before it, as its peak.
  if (a.keep_scopes++ == 0) {
    a.scope_pid = getpid();
    a.peak_bytes = a.live_bytes + a.kept_bytes;
    a.fresh_bytes = a.largest_carry_size = 0;
    a.carry_sizes.clear();
  }
}

KeepFreedSharedPages::~KeepFreedSharedPages() {
  if (!keeping_freed_pages()) return;
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  // (In a forked child, a scope of its parent's ends as if it never began.)
  if (!in_scope(a) || --a.keep_scopes > 0) return;
  // (A forked child that has mapped no buffer of its own holds its parent's
  // kept ranges: punching them would free the parent's pages.)
  if (a.pid != getpid()) {
    a.kept.clear();
    a.kept_bytes = 0;
    return;
  }
  // Carried to the next scope: of each size this scope asked for, the most
  // recently freed range -- the next will ask for one of that size
  // again before it frees any (at stage 3 the first grad buffer of a
  // backward, of each unit size) -- most recently freed first, in all no
  // more than the largest of them and the slack. About one buffer: the first
  // grad buffer of a backward is in use beside all of the forward's
  // activations, so holding its pages through the forward adds nothing to
  // the step's peak; a second would (+39 MB of peak RSS on the ~101M GPT at
  // stage 3, docs/performance.md).
  std::deque<SharedRange> carried;
  size_t carried_bytes = 0;
  const bool carry = keep_mode() == KeepMode::On;
  for (auto it = a.kept.rbegin(); it != a.kept.rend(); ++it) {
    const bool asked_for = a.carry_sizes.count(it->bytes) > 0;
    const bool first_of_size =
        std::none_of(carried.begin(), carried.end(), [&](const SharedRange& c) { return c.bytes == it->bytes; });
    if (carry && asked_for && first_of_size &&
        carried_bytes + it->bytes <= a.largest_carry_size + kKeptPagesSlackBytes) {
      carried.push_front(*it);
      carried_bytes += it->bytes;
    } else {
      punch_kept(a, *it);
    }
  }
  a.kept = std::move(carried);
}

void release_kept_shared_pages() {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (in_scope(a) || a.pid != getpid()) return;
  for (const SharedRange& k : a.kept) punch_kept(a, k);
  a.kept.clear();
}

SharedArenaStats shared_arena_stats() {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  return {a.kept_reuses, a.kept_bytes, a.fresh_bytes, a.pid == getpid() ? a.inode : 0};
}

KeptBytesObserver set_kept_bytes_observer(KeptBytesObserver observer) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  return std::exchange(a.observer, observer);
}

}  // namespace zero::memory

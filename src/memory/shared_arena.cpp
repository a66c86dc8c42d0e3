#include "memory/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

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
};

// Never destroyed: buffers are freed during exit too.
Arena& arena() {
  static auto* a = new Arena;
  return *a;
}

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
    a.pid = getpid();
    a.fd = -1;
    a.inode = 0;
    a.unavailable = false;
    a.end = 0;
    a.freed.clear();
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

}  // namespace

std::optional<SharedRange> map_shared_range(size_t bytes) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!ensure_memfd(a)) return std::nullopt;
  const size_t len = page_rounded(bytes);
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
  return SharedRange{static_cast<char*>(p), len, offset, a.fd, a.inode, a.pid};
}

bool punch_shared_range(const SharedRange& r) {
  return fallocate(r.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(r.offset),
                   static_cast<off_t>(r.bytes)) == 0;
}

void free_shared_range(const SharedRange& r) {
  munmap(r.ptr, r.bytes);
  if (r.owner != getpid()) return;  // a forked child's copy of its parent's buffer
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  // Reused only once its pages are gone: the next buffer starts zero-filled.
  if (a.pid == r.owner && punch_shared_range(r)) a.freed.emplace(r.bytes, r.offset);
}

}  // namespace zero::memory

#include "comm/shm/peer_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace zero::comm::shm {

namespace {

// Opens and maps `ref`'s whole buffer read-only; returns its base, or null
// with `why` set. `fd_out` gets the open descriptor.
const char* map_ref(const BufferRef& ref, int* fd_out, std::string* why) {
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ref.inode || st.st_size < ref.map_bytes) {
    close(fd);
    *why = path + " is no longer the buffer it published (freed before its collective ended?)";
    return nullptr;
  }
  void* p = mmap(nullptr, static_cast<size_t>(ref.map_bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = "cannot map " + path + ": " + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return static_cast<const char*>(p);
}

}  // namespace

PeerBuffers::~PeerBuffers() {
  while (!entries_.empty()) drop(entries_.size() - 1);
}

bool PeerBuffers::alive(const Entry& e) {
  struct stat st {};
  return fstat(e.fd, &st) == 0 && st.st_size >= e.bytes;
}

void PeerBuffers::drop(size_t i) {
  munmap(const_cast<char*>(entries_[i].base), static_cast<size_t>(entries_[i].bytes));
  close(entries_[i].fd);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

void PeerBuffers::drop_stale() {
  for (size_t i = entries_.size(); i-- > 0;)
    if (!alive(entries_[i])) drop(i);
  while (entries_.size() >= kMaxCached) drop(0);  // least recently used
}

const char* PeerBuffers::data(int peer, const BufferRef& ref) {
  for (size_t i = entries_.size(); i-- > 0;) {
    Entry& e = entries_[i];
    if (e.peer != peer || e.inode != ref.inode || e.bytes != ref.map_bytes) continue;
    const char* base = e.base;
    if (i + 1 != entries_.size()) {  // keep the order by use
      Entry moved = e;
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      entries_.push_back(moved);
    }
    return base + ref.offset;
  }
  drop_stale();
  std::string why;
  int fd = -1;
  const char* base = map_ref(ref, &fd, &why);
  if (!base)
    throw std::runtime_error("zero-copy read of rank " + std::to_string(peer) + "'s buffer: " + why +
                             " (ZERO_COMM_ZERO_COPY=off stages every collective instead)");
  entries_.push_back(Entry{peer, ref.inode, ref.map_bytes, fd, base});
  return base + ref.offset;
}

bool PeerBuffers::can_map(const BufferRef& ref, std::string* why) {
  int fd = -1;
  const char* base = map_ref(ref, &fd, why);
  if (!base) return false;
  munmap(const_cast<char*>(base), static_cast<size_t>(ref.map_bytes));
  close(fd);
  return true;
}

}  // namespace zero::comm::shm

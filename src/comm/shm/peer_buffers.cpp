#include "comm/shm/peer_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "common/fd_limit.h"

namespace zero::comm::shm {

namespace {

// Maps `ref`'s buffer read-only; returns its base, or null with `why` set.
const char* map_ref(const BufferRef& ref, std::string* why) {
  const std::string path = "/proc/" + std::to_string(ref.pid) + "/fd/" + std::to_string(ref.fd);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = is_fd_shortage(errno) ? out_of_descriptors("cannot open " + path, errno)
                                 : "cannot open " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ref.inode ||
      st.st_size < ref.map_offset + ref.map_bytes) {
    close(fd);
    *why = path + " is no longer the memory it published";
    return nullptr;
  }
  void* p = mmap(nullptr, static_cast<size_t>(ref.map_bytes), PROT_READ, MAP_SHARED, fd,
                 static_cast<off_t>(ref.map_offset));
  const int err = errno;
  close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) {
    *why = "cannot map " + path + ": " + std::strerror(err);
    return nullptr;
  }
  return static_cast<const char*>(p);
}

// ZERO_COMM_PEER_PAGES: release (unset) or keep.
bool releasing_read_pages() {
  static const bool release = [] {
    const char* v = std::getenv("ZERO_COMM_PEER_PAGES");
    if (!v || !*v || std::strcmp(v, "release") == 0) return true;
    if (std::strcmp(v, "keep") == 0) return false;
    throw std::invalid_argument(std::string("ZERO_COMM_PEER_PAGES=") + v + ": expected release or keep");
  }();
  return release;
}

}  // namespace

PeerBuffers::PeerBuffers() : release_read_(releasing_read_pages()) {}

PeerBuffers::~PeerBuffers() {
  while (!entries_.empty()) drop(entries_.size() - 1);
}

void PeerBuffers::drop(size_t i) {
  munmap(const_cast<char*>(entries_[i].base), static_cast<size_t>(entries_[i].bytes));
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

const char* PeerBuffers::data(int peer, const BufferRef& ref) {
  for (size_t i = entries_.size(); i-- > 0;) {
    Entry& e = entries_[i];
    if (e.peer != peer || e.inode != ref.inode || e.map_offset != ref.map_offset || e.bytes != ref.map_bytes)
      continue;
    const char* base = e.base;
    e.read = true;
    if (i + 1 != entries_.size()) {  // keep the order by use
      Entry moved = e;
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      entries_.push_back(moved);
    }
    return base + ref.offset;
  }
  while (entries_.size() >= kMaxCached) drop(0);  // least recently used
  std::string why;
  const char* base = map_ref(ref, &why);
  if (!base)
    throw std::runtime_error("zero-copy read of rank " + std::to_string(peer) + "'s buffer: " + why +
                             " (ZERO_COMM_ZERO_COPY=off stages every collective instead)");
  entries_.push_back(Entry{peer, ref.inode, ref.map_offset, ref.map_bytes, base, true});
  return base + ref.offset;
}

void PeerBuffers::release_read_pages() {
  for (Entry& e : entries_) {
    // Best effort: a failure leaves the entries mapped, which costs RSS only.
    if (e.read && release_read_) madvise(const_cast<char*>(e.base), static_cast<size_t>(e.bytes), MADV_DONTNEED);
    e.read = false;
  }
}

bool PeerBuffers::can_map(const BufferRef& ref, std::string* why) {
  const char* base = map_ref(ref, why);
  if (!base) return false;
  munmap(const_cast<char*>(base), static_cast<size_t>(ref.map_bytes));
  return true;
}

}  // namespace zero::comm::shm

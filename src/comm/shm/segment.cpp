#include "comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace zero::comm::shm {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(err));
}

void* map(int fd, size_t bytes, const std::string& path) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("cannot map", path, errno);
  return p;
}

}  // namespace

std::string Segment::directory() {
  const char* d = std::getenv("ZERO_SHM_DIR");
  return d && *d ? d : "/dev/shm";
}

Segment Segment::create(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot create shared memory", path, errno);
  // Reserve the pages now: tmpfs would otherwise accept the size and kill
  // the job with SIGBUS on first touch once it is full.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err) {
    ::close(fd);
    ::unlink(path.c_str());
    fail("cannot reserve " + std::to_string(bytes >> 20) + " MiB of shared memory for", path, err);
  }
  void* p = nullptr;
  try {
    p = map(fd, bytes, path);
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  ::close(fd);
  return Segment(p, bytes);
}

Segment Segment::open(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("cannot open shared memory", path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    throw std::runtime_error("shared memory " + path + " has " + std::to_string(st.st_size) + " bytes, expected " +
                             std::to_string(bytes));
  }
  void* p = nullptr;
  try {
    p = map(fd, bytes, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return Segment(p, bytes);
}

void Segment::unlink(const std::string& path) { ::unlink(path.c_str()); }

Segment::Segment(Segment&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Segment::~Segment() {
  if (data_) munmap(data_, size_);
}

}  // namespace zero::comm::shm

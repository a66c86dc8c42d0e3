// A named shared-memory segment: a file under /dev/shm (or ZERO_SHM_DIR)
// mapped by every rank of a group on one host. The creator reserves its
// pages up front (posix_fallocate), so a full /dev/shm fails at setup with
// a message instead of as SIGBUS in the middle of a collective. The name is
// unlinked as soon as every rank has mapped it: a killed job leaves nothing
// in /dev/shm. No torch.
#pragma once

#include <cstddef>
#include <string>

namespace zero::comm::shm {

class Segment {
 public:
  Segment() = default;
  // Throws std::runtime_error naming the path and the errno text.
  static Segment create(const std::string& path, size_t bytes);
  static Segment open(const std::string& path, size_t bytes);
  static void unlink(const std::string& path);  // ignores a missing file
  // The directory segments live in: $ZERO_SHM_DIR, else /dev/shm.
  static std::string directory();

  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Segment(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zero::comm::shm

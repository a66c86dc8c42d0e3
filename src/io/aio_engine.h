// Asynchronous direct I/O for ZeRO-Infinity's swap files (DeepSpeed's
// csrc/aio, `aio` block of ds_config): several reads and writes in flight
// on io_uring (liburing), O_DIRECT so the page cache neither doubles the
// memory the swap exists to save nor hides the disk's real speed.
//
// A request is cut into block_size pieces; at most queue_depth pieces are
// in flight per thread; thread_count threads each own a ring and a share
// of the pieces. The caller overlaps its own work with the I/O: submit,
// compute, wait.
//
// Alignment: buffers, offsets and lengths must be multiples of kAlignment
// (O_DIRECT's rule); a request that is not is refused (std::invalid_argument)
// with a message naming which value. Errors (EIO, ENOSPC, a short transfer) surface at wait(), as
// IoError naming the file, the offset and the cause.
//
// No torch header: the swappers wrap their tensors' memory.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace zero::io {

inline constexpr int64_t kAlignment = 4096;

// The ds_config `aio` block, with DeepSpeed's defaults.
struct AioConfig {
  int64_t block_size = 1 << 20;  // bytes per request piece
  int queue_depth = 8;           // pieces in flight per thread
  int thread_count = 1;          // threads (each its own ring) serving requests
  bool single_submit = false;    // submit pieces one at a time, not in batches
  bool overlap_events = true;    // submit new pieces while earlier ones complete
};

class IoError : public std::runtime_error {
 public:
  IoError(const std::string& what, int error_number) : std::runtime_error(what), error_number_(error_number) {}
  int error_number() const { return error_number_; }  // errno of the failure (ENOSPC, EIO, ...)
 private:
  int error_number_;
};

// Memory aligned for direct I/O (kAlignment), freed with the object.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);  // rounded up to kAlignment; throws std::bad_alloc
  AlignedBuffer(AlignedBuffer&&) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// A file opened for direct I/O; closed (and, when `scratch`, unlinked) with
// the object.
class DirectFile {
 public:
  // Creates or opens `path` read-write with O_DIRECT. A scratch file is
  // unlinked when closed. Throws IoError naming the path and the cause
  // (a missing directory, no permission, a filesystem without O_DIRECT).
  DirectFile(const std::string& path, bool scratch);
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Reserves `bytes` on disk (fallocate), so a full disk is found here,
  // before training, not mid-step; throws IoError (ENOSPC) naming the path.
  void reserve(int64_t bytes);

 private:
  std::string path_;
  int fd_ = -1;
  bool scratch_ = false;
};

class AioEngine {
 public:
  using Ticket = uint64_t;

  // Starts thread_count workers, each with its ring. Throws
  // std::invalid_argument naming the aio key of a value it cannot honour
  // (block_size not a positive multiple of kAlignment or over 1 GiB,
  // queue_depth outside 1..4096, thread_count outside 1..256), IoError
  // when the kernel refuses io_uring.
  explicit AioEngine(const AioConfig& config);
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;
  ~AioEngine();  // waits for every request in flight (errors then are dropped)

  // Queue a transfer of `bytes` between `buffer` and `file` at `offset`;
  // returns at once. The buffer must stay alive and untouched until wait().
  Ticket read(const DirectFile& file, void* buffer, int64_t bytes, int64_t offset);
  Ticket write(const DirectFile& file, const void* buffer, int64_t bytes, int64_t offset);

  // Blocks until the request is complete; throws IoError for its failure.
  // Each ticket is waited for once.
  void wait(Ticket ticket);
  // Waits for every request queued so far; throws the first failure.
  void wait_all();

  const AioConfig& config() const { return config_; }

 private:
  Ticket submit(const DirectFile& file, char* buffer, int64_t bytes, int64_t offset, bool is_read);
  struct Impl;
  AioConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::io

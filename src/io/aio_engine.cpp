// The asynchronous direct I/O engine (aio_engine.h) on io_uring.
//
// Each worker thread owns one ring and a FIFO of "shares": the contiguous
// run of a request's pieces given to that thread. A worker keeps at most
// queue_depth pieces in flight, drawn in order from its shares (so the
// pieces of consecutive requests pipeline). The aio knobs, as DeepSpeed's:
//   overlap_events  true: a new piece is submitted as soon as one completes;
//                   false: a batch of up to queue_depth pieces is submitted
//                   and all of it reaped before the next batch.
//   single_submit   true: one io_uring_enter per piece; false: one per batch.
// A piece that completes short is resubmitted for the rest (it stays in
// flight); EAGAIN/EINTR are retried; any other failure is recorded on its
// request (the first one wins) and the request's remaining pieces are
// dropped unsubmitted. A request completes when its last piece does.
#include "io/aio_engine.h"
#include "io/aio_engine_testing.h"

#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace zero::io {

namespace {

std::string errno_text(int err) {
  if (err == ENOSPC) return std::string("the disk is full (") + std::strerror(err) + ")";
  if (err == EDQUOT) return std::string("the disk quota is exhausted (") + std::strerror(err) + ")";
  return std::strerror(err);
}

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

constexpr int64_t kHugePage = int64_t{2} << 20;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

void check_aligned(const char* what, const std::string& op, const std::string& path, const char* name,
                   int64_t value) {
  if (value % kAlignment != 0) {
    throw std::invalid_argument(std::string("AioEngine::") + what + " of " + path + ": " + op + name + " " +
                                std::to_string(value) + " is not a multiple of " + std::to_string(kAlignment) +
                                " (O_DIRECT's alignment)");
  }
}

std::atomic<bool> g_split_transfers{false};

}  // namespace

namespace testing {
void split_transfers(bool on) { g_split_transfers.store(on, std::memory_order_relaxed); }
}  // namespace testing

// ---- AlignedBuffer ------------------------------------------------------------

AlignedBuffer::AlignedBuffer(int64_t bytes) {
  if (bytes < 0) throw std::invalid_argument("AlignedBuffer: negative size " + std::to_string(bytes));
  if (bytes == 0) return;
  const int64_t rounded = round_up(bytes, kAlignment);
  // From 2 MiB, huge pages where the kernel has them (transparent huge
  // pages, "madvise" mode included): a direct transfer pins and maps one
  // page per 2 MiB instead of 512, and the device gets fewer, longer segments.
  const bool huge = rounded >= kHugePage;
  void* p = nullptr;
  if (posix_memalign(&p, static_cast<size_t>(huge ? kHugePage : kAlignment), static_cast<size_t>(rounded)) != 0) {
    throw std::bad_alloc();
  }
  if (huge) ::madvise(p, static_cast<size_t>(rounded), MADV_HUGEPAGE);  // advice: a refusal changes nothing
  data_ = p;
  bytes_ = rounded;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

// ---- DirectFile -------------------------------------------------------------

DirectFile::DirectFile(const std::string& path, bool scratch) : path_(path), scratch_(scratch) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ >= 0) return;
  const int err = errno;
  const std::string dir = directory_of(path);
  const std::string head = "cannot open " + path + " for direct I/O: ";
  struct stat st {};
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        throw IoError(head + "the directory " + dir + " does not exist (create it, or point nvme_path at one that does)",
                      err);
      }
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      throw IoError(head + "the directory " + dir + " is not writable (" + std::strerror(err) +
                        "; make it writable by this user, or point nvme_path at a writable directory)",
                    err);
    case EINVAL:
      throw IoError(head + "the filesystem of " + dir + " refuses O_DIRECT (" + std::strerror(err) +
                        "; tmpfs before Linux 6.6, some FUSE and network filesystems do): point nvme_path at a "
                        "directory on a local disk filesystem (ext4, xfs)",
                    err);
    case ENOSPC:
    case EDQUOT:
      throw IoError(head + errno_text(err), err);
    default:
      break;
  }
  throw IoError(head + std::strerror(err), err);
}

DirectFile::~DirectFile() {
  if (fd_ < 0) return;
  if (scratch_) ::unlink(path_.c_str());
  ::close(fd_);
}

void DirectFile::reserve(int64_t bytes) {
  if (bytes <= 0) return;
  if (::fallocate(fd_, 0, 0, bytes) == 0) return;
  const int err = errno;
  if (err == EOPNOTSUPP) {
    // The filesystem cannot allocate ahead; at least the size is set (a full
    // disk is then found at the first write, at wait()).
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && st.st_size >= bytes) return;
    if (::ftruncate(fd_, bytes) == 0) return;
  }
  throw IoError("cannot reserve " + std::to_string(bytes) + " bytes for " + path_ + ": " + errno_text(err), err);
}

// ---- AioEngine --------------------------------------------------------------

namespace {

struct Request {
  std::string path;
  bool is_read = false;
  std::atomic<int64_t> pending{0};  // pieces not yet finished
  std::atomic<bool> failed{false};  // set with the first error: later pieces are not submitted
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int error = 0;
  std::string error_text;

  void fail(int err, int64_t bytes, int64_t offset, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (error != 0) return;
    error = err;
    error_text = std::string("AioEngine: ") + (is_read ? "read" : "write") + " of " + std::to_string(bytes) +
                 " bytes at offset " + std::to_string(offset) + " of " + path + " failed: " + why;
    failed.store(true, std::memory_order_release);
  }
  void finish_pieces(int64_t n) {
    if (pending.fetch_sub(n, std::memory_order_acq_rel) == n) {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    }
  }
};

// A contiguous run of one request's pieces, served by one worker.
struct Share {
  std::shared_ptr<Request> request;
  int fd = -1;
  char* buffer = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// One piece in flight (or its rest, after a short transfer).
struct Slot {
  Request* request = nullptr;
  std::shared_ptr<Request> owner;  // keeps the request alive while the piece is in flight
  int fd = -1;
  char* buffer = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;  // still to transfer
};

}  // namespace

struct Worker {
  const AioConfig config;
  io_uring ring{};
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Share> queue;
  bool stop = false;

  // Worker-thread state.
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  int in_flight = 0;
  int unsubmitted = 0;  // prepared SQEs not yet handed to the kernel
  Share current;         // the share being cut into pieces

  explicit Worker(const AioConfig& c) : config(c) {}

  // Creates the ring in the thread that uses it; reports how that went.
  void run(std::promise<int>* started) {
    const unsigned entries = static_cast<unsigned>(config.queue_depth);
    // Completions run in this thread when it reaps (no interrupting task
    // work): DEFER_TASKRUN (Linux 6.1) or else COOP_TASKRUN (5.19), as fio
    // sets up its rings; plain on older kernels.
    int rc = -EINVAL;
    for (unsigned flags : {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, IORING_SETUP_COOP_TASKRUN, 0u}) {
      rc = io_uring_queue_init(entries, &ring, flags);
      if (rc != -EINVAL) break;
    }
    if (rc < 0) {
      started->set_value(-rc);
      return;
    }
    started->set_value(0);
    slots.resize(static_cast<size_t>(config.queue_depth));
    for (int i = config.queue_depth - 1; i >= 0; --i) free_slots.push_back(i);
    loop();
    io_uring_queue_exit(&ring);
  }

  // The next share to cut, or false when there is none queued (waits for one
  // only when `block`; then false means stop).
  bool next_share(bool block) {
    std::unique_lock<std::mutex> lock(mu);
    if (block) cv.wait(lock, [&] { return stop || !queue.empty(); });
    if (queue.empty()) return false;
    current = std::move(queue.front());
    queue.pop_front();
    return true;
  }

  void submit_pending() {
    while (unsubmitted > 0) {
      const int rc = io_uring_submit(&ring);
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      if (rc < 0) throw std::runtime_error(std::string("io_uring_submit: ") + std::strerror(-rc));
      unsubmitted -= rc;
    }
  }

  void prepare(int index) {
    Slot& s = slots[static_cast<size_t>(index)];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {  // cannot happen (in flight <= queue_depth <= entries), but never lose a piece
      submit_pending();
      sqe = io_uring_get_sqe(&ring);
    }
    int64_t len = s.bytes;
    if (g_split_transfers.load(std::memory_order_relaxed) && len >= 2 * kAlignment) {
      len = len / 2 / kAlignment * kAlignment;  // tests: the kernel's answer is then short, as after a signal
    }
    if (s.request->is_read) {
      io_uring_prep_read(sqe, s.fd, s.buffer, static_cast<unsigned>(len), static_cast<uint64_t>(s.offset));
    } else {
      io_uring_prep_write(sqe, s.fd, s.buffer, static_cast<unsigned>(len), static_cast<uint64_t>(s.offset));
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(index));
    ++unsubmitted;
    if (config.single_submit) submit_pending();
  }

  // Cuts up to `room` pieces from the shares and prepares them; returns how many.
  int fill(int room) {
    int added = 0;
    while (added < room) {
      if (current.bytes == 0) {
        current = Share{};
        if (!next_share(false)) break;
      }
      const int64_t len = std::min<int64_t>(current.bytes, config.block_size);
      if (current.request->failed.load(std::memory_order_acquire)) {
        // Its request has failed: the rest of this share is not worth doing.
        const int64_t left = (current.bytes + config.block_size - 1) / config.block_size;
        current.request->finish_pieces(left);
        current = Share{};
        continue;
      }
      const int index = free_slots.back();
      free_slots.pop_back();
      Slot& s = slots[static_cast<size_t>(index)];
      s.request = current.request.get();
      s.owner = current.request;
      s.fd = current.fd;
      s.buffer = current.buffer;
      s.offset = current.offset;
      s.bytes = len;
      current.buffer += len;
      current.offset += len;
      current.bytes -= len;
      ++in_flight;
      prepare(index);
      ++added;
    }
    // A batch is submitted by reap(), which submits and waits in one call.
    return added;
  }

  void release(int index, int64_t pieces) {
    Slot& s = slots[static_cast<size_t>(index)];
    std::shared_ptr<Request> owner = std::move(s.owner);
    s.request = nullptr;
    free_slots.push_back(index);
    --in_flight;
    owner->finish_pieces(pieces);
  }

  void complete(const io_uring_cqe* cqe) {
    const int index = static_cast<int>(io_uring_cqe_get_data64(cqe));
    Slot& s = slots[static_cast<size_t>(index)];
    const int res = cqe->res;
    if (res == -EAGAIN || res == -EINTR) {
      prepare(index);
      return;
    }
    if (res < 0) {
      s.request->fail(-res, s.bytes, s.offset, errno_text(-res));
      release(index, 1);
      return;
    }
    if (res == 0) {
      if (s.request->is_read) {
        s.request->fail(ENODATA, s.bytes, s.offset, "the file ends before it (a read past its end)");
      } else {
        s.request->fail(EIO, s.bytes, s.offset, "the device accepted 0 bytes");
      }
      release(index, 1);
      return;
    }
    if (res < s.bytes && s.request->is_read && res % kAlignment != 0) {
      // O_DIRECT moves whole blocks except at the end of the file.
      s.request->fail(ENODATA, s.bytes, s.offset,
                      "the file ends at byte " + std::to_string(s.offset + res) + " (a read past its end)");
      release(index, 1);
      return;
    }
    if (res < s.bytes) {  // a short transfer: the rest goes again
      s.buffer += res;
      s.offset += res;
      s.bytes -= res;
      prepare(index);
      return;
    }
    release(index, 1);
  }

  // Reaps at least `at_least` completions (blocking), then whatever else is ready.
  void reap(int at_least) {
    int seen = 0;
    while (true) {
      io_uring_cqe* cqe = nullptr;
      int rc;
      if (seen < at_least) {
        const unsigned wait_nr = static_cast<unsigned>(at_least - seen);
        if (unsubmitted > 0) {
          rc = io_uring_submit_and_wait(&ring, wait_nr);
          if (rc >= 0) unsubmitted -= rc;
          if (rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) rc = io_uring_peek_cqe(&ring, &cqe);
        } else {
          rc = io_uring_wait_cqe_nr(&ring, &cqe, wait_nr);
        }
        if (rc == -EINTR || rc == -EAGAIN || (rc == 0 && cqe == nullptr)) continue;
        if (rc < 0) throw std::runtime_error(std::string("io_uring_wait_cqe: ") + std::strerror(-rc));
      } else {
        if (io_uring_peek_cqe(&ring, &cqe) != 0 || cqe == nullptr) break;
      }
      complete(cqe);
      io_uring_cqe_seen(&ring, cqe);
      ++seen;
    }
  }

  void loop() {
    while (true) {
      if (in_flight == 0 && current.bytes == 0) {
        current = Share{};
        if (!next_share(true)) return;  // stop, nothing queued
      }
      if (config.overlap_events) {
        fill(config.queue_depth - in_flight);
        if (in_flight > 0) reap(1);
      } else {
        fill(config.queue_depth - in_flight);     // in_flight is 0 here: a whole batch
        while (in_flight > 0) reap(in_flight);    // drained before the next batch
      }
    }
  }
};

struct AioEngine::Impl {
  std::vector<std::unique_ptr<Worker>> workers;
  std::mutex mu;
  uint64_t next_ticket = 1;
  std::map<Ticket, std::shared_ptr<Request>> requests;

  void stop_workers() {
    for (auto& w : workers) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->stop = true;
      }
      w->cv.notify_all();
    }
    for (auto& w : workers) {
      if (w->thread.joinable()) w->thread.join();
    }
  }
};

AioEngine::AioEngine(const AioConfig& config) : config_(config), impl_(std::make_unique<Impl>()) {
  auto bad = [](const std::string& key, int64_t value, const std::string& why) {
    throw std::invalid_argument("aio." + key + " " + std::to_string(value) + ": " + why);
  };
  if (config.block_size <= 0 || config.block_size % kAlignment != 0) {
    bad("block_size", config.block_size, "must be a positive multiple of " + std::to_string(kAlignment));
  }
  if (config.block_size > (int64_t{1} << 30)) bad("block_size", config.block_size, "must be at most 1 GiB");
  if (config.queue_depth < 1 || config.queue_depth > 4096) bad("queue_depth", config.queue_depth, "must be 1 to 4096");
  if (config.thread_count < 1 || config.thread_count > 256) {
    bad("thread_count", config.thread_count, "must be 1 to 256");
  }
  int failure = 0;
  for (int t = 0; t < config.thread_count; ++t) {
    auto w = std::make_unique<Worker>(config);
    std::promise<int> started;
    std::future<int> result = started.get_future();
    Worker* raw = w.get();
    w->thread = std::thread([raw, &started] { raw->run(&started); });
    failure = result.get();
    impl_->workers.push_back(std::move(w));
    if (failure != 0) break;
  }
  if (failure != 0) {
    impl_->stop_workers();
    throw IoError(std::string("AioEngine: cannot set up an io_uring ring (") + std::strerror(failure) +
                      (failure == ENOSYS || failure == EPERM
                           ? "): io_uring is disabled here (kernel.io_uring_disabled, or a container's seccomp "
                             "profile)"
                           : ")"),
                  failure);
  }
}

AioEngine::~AioEngine() {
  std::vector<std::shared_ptr<Request>> left;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [ticket, request] : impl_->requests) left.push_back(request);
    impl_->requests.clear();
  }
  for (auto& r : left) {
    std::unique_lock<std::mutex> lock(r->mu);
    r->cv.wait(lock, [&] { return r->done; });
  }
  impl_->stop_workers();
}

AioEngine::Ticket AioEngine::read(const DirectFile& file, void* buffer, int64_t bytes, int64_t offset) {
  return submit(file, static_cast<char*>(buffer), bytes, offset, true);
}

AioEngine::Ticket AioEngine::write(const DirectFile& file, const void* buffer, int64_t bytes, int64_t offset) {
  return submit(file, static_cast<char*>(const_cast<void*>(buffer)), bytes, offset, false);
}

AioEngine::Ticket AioEngine::submit(const DirectFile& file, char* buffer, int64_t bytes, int64_t offset,
                                    bool is_read) {
  const char* what = is_read ? "read" : "write";
  if (file.fd() < 0) throw std::invalid_argument(std::string("AioEngine::") + what + ": the file is not open");
  if (bytes < 0) {
    throw std::invalid_argument(std::string("AioEngine::") + what + " of " + file.path() + ": the length " +
                                std::to_string(bytes) + " is negative");
  }
  if (offset < 0) {
    throw std::invalid_argument(std::string("AioEngine::") + what + " of " + file.path() + ": the offset " +
                                std::to_string(offset) + " is negative");
  }
  const auto address = reinterpret_cast<uintptr_t>(buffer);
  if (address % kAlignment != 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(address));
    throw std::invalid_argument(std::string("AioEngine::") + what + " of " + file.path() + ": the buffer address " +
                                hex + " is not a multiple of " + std::to_string(kAlignment) +
                                " (O_DIRECT's alignment)");
  }
  check_aligned(what, "the ", file.path(), "offset", offset);
  check_aligned(what, "the ", file.path(), "length", bytes);

  auto request = std::make_shared<Request>();
  request->path = file.path();
  request->is_read = is_read;
  const int64_t pieces = (bytes + config_.block_size - 1) / config_.block_size;
  request->pending.store(pieces, std::memory_order_relaxed);
  request->done = pieces == 0;
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ticket = impl_->next_ticket++;
    impl_->requests.emplace(ticket, request);
  }
  if (pieces == 0) return ticket;
  // Contiguous shares of whole pieces, one per thread (fewer when there are
  // fewer pieces than threads); the first share goes to the threads in turn,
  // so requests of one piece spread over all of them.
  const int64_t threads = std::min<int64_t>(config_.thread_count, pieces);
  const int64_t first_worker = static_cast<int64_t>(ticket % static_cast<uint64_t>(config_.thread_count));
  const int64_t per = pieces / threads, extra = pieces % threads;
  int64_t first = 0;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t n = per + (t < extra ? 1 : 0);
    const int64_t start = first * config_.block_size;
    const int64_t end = std::min(bytes, (first + n) * config_.block_size);
    first += n;
    Worker& w = *impl_->workers[static_cast<size_t>((first_worker + t) % config_.thread_count)];
    {
      std::lock_guard<std::mutex> lock(w.mu);
      w.queue.push_back(Share{request, file.fd(), buffer + start, offset + start, end - start});
    }
    w.cv.notify_one();
  }
  return ticket;
}

void AioEngine::wait(Ticket ticket) {
  std::shared_ptr<Request> r;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->requests.find(ticket);
    if (it == impl_->requests.end()) {
      throw std::invalid_argument("AioEngine::wait: ticket " + std::to_string(ticket) +
                                  " is unknown or was already waited for");
    }
    r = it->second;
    impl_->requests.erase(it);
  }
  std::unique_lock<std::mutex> lock(r->mu);
  r->cv.wait(lock, [&] { return r->done; });
  if (r->error != 0) throw IoError(r->error_text, r->error);
}

void AioEngine::wait_all() {
  std::vector<Ticket> tickets;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& [ticket, request] : impl_->requests) tickets.push_back(ticket);
  }
  std::unique_ptr<IoError> first;
  for (Ticket t : tickets) {
    try {
      wait(t);
    } catch (const IoError& e) {
      if (!first) first = std::make_unique<IoError>(e);
    } catch (const std::invalid_argument&) {
      // waited for meanwhile by another thread
    }
  }
  if (first) throw *first;
}

}  // namespace zero::io

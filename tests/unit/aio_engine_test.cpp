// The asynchronous direct I/O engine (src/io/aio_engine.h): round trips
// checked byte for byte (and against the file as plain reads see it), reads
// overlapping writes of other regions, alignment refusals, the errors a
// swap directory can give (missing, read-only, full disk), and teardown
// with requests in flight.
#include <algorithm>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <system_error>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/aio_engine.h"
#include "io/aio_engine_testing.h"

namespace {

using zero::io::AioConfig;
using zero::io::AioEngine;
using zero::io::AlignedBuffer;
using zero::io::DirectFile;
using zero::io::IoError;
using zero::io::kAlignment;

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

// A fresh directory (on the temp filesystem: ext4 or xfs in CI, which take
// O_DIRECT), removed with the object.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("ZERO_AIO_TEST_DIR");
    std::string templ = std::string(base ? base : "/tmp") + "/zero-aio-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp " + templ + ": " + std::strerror(errno));
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Bytes that differ at every offset and per seed.
void fill(void* p, int64_t bytes, int64_t base_offset, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  for (int64_t i = 0; i < bytes / 8; ++i) {
    uint64_t x = static_cast<uint64_t>(base_offset / 8 + i) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    w[i] = x ^ (x >> 29);
  }
}

// The file as a plain (buffered) read sees it.
std::vector<char> plain_read(const std::string& path, int64_t offset, int64_t bytes) {
  std::vector<char> out(static_cast<size_t>(bytes));
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  int64_t done = 0;
  while (fd >= 0 && done < bytes) {
    const ssize_t n = ::pread(fd, out.data() + done, static_cast<size_t>(bytes - done), offset + done);
    if (n <= 0) break;
    done += n;
  }
  EXPECT_EQ(done, bytes) << path;
  if (fd >= 0) ::close(fd);
  return out;
}

int count_entries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// Request sizes cycling through these (multiples of 4 KiB), so requests
// straddle pieces and a request's last piece is short.
const int64_t kRequestSizes[] = {4 * KiB, 132 * KiB, 1 * MiB + 12 * KiB, 40 * KiB, 2 * MiB, 8 * KiB, 700 * KiB};

struct Case {
  int64_t block_size;
  int queue_depth;
  int threads;
  bool overlap;
  bool single_submit;
};

std::string describe(const Case& c) {
  return "block_size " + std::to_string(c.block_size) + " queue_depth " + std::to_string(c.queue_depth) +
         " threads " + std::to_string(c.threads) + " overlap " + std::to_string(c.overlap) + " single_submit " +
         std::to_string(c.single_submit);
}

// Writes `total` bytes as many requests, reads them back as differently cut
// requests, compares both with what was written and with a plain read.
void round_trip(const Case& c, int64_t total, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  TempDir dir;
  DirectFile file(dir.path() + "/swap", true);
  AioConfig config;
  config.block_size = c.block_size;
  config.queue_depth = c.queue_depth;
  config.thread_count = c.threads;
  config.overlap_events = c.overlap;
  config.single_submit = c.single_submit;
  AioEngine engine(config);
  AlignedBuffer out(total), in(total);
  fill(out.data(), total, 0, seed);
  std::memset(in.data(), 0xA5, static_cast<size_t>(total));
  auto* src = static_cast<char*>(out.data());
  auto* dst = static_cast<char*>(in.data());

  std::vector<AioEngine::Ticket> tickets;
  int64_t at = 0;
  for (size_t i = 0; at < total; ++i) {
    const int64_t n = std::min(kRequestSizes[i % std::size(kRequestSizes)], total - at);
    tickets.push_back(engine.write(file, src + at, n, at));
    at += n;
  }
  ASSERT_GT(tickets.size(), 8u);
  for (auto t : tickets) engine.wait(t);  // each ticket on its own

  at = 0;
  for (size_t i = 3; at < total; ++i) {  // cut differently from the writes
    const int64_t n = std::min(kRequestSizes[i % std::size(kRequestSizes)], total - at);
    engine.read(file, dst + at, n, at);
    at += n;
  }
  engine.wait_all();
  ASSERT_EQ(std::memcmp(src, dst, static_cast<size_t>(total)), 0) << "read back differs from what was written";
  const auto plain = plain_read(file.path(), 0, total);
  ASSERT_EQ(std::memcmp(src, plain.data(), static_cast<size_t>(total)), 0) << "the file differs from what was written";
}

TEST(AioEngine, RoundTripManyRequestsByteForByte) {
  const int64_t total = 6 * MiB + 36 * KiB;  // not a multiple of any block size
  uint64_t seed = 1;
  for (int64_t bs : {4 * KiB, 128 * KiB, 1 * MiB}) {
    for (int qd : {1, 4, 32}) {
      for (int threads : {1, 2}) {
        for (bool overlap : {true, false}) {
          round_trip({bs, qd, threads, overlap, false}, total, seed++);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  // single_submit, both overlap modes.
  round_trip({128 * KiB, 8, 2, true, true}, total, seed++);
  round_trip({64 * KiB, 4, 1, false, true}, total, seed++);
}

TEST(AioEngine, ShortTransfersResubmittedForTheRest) {
  zero::io::testing::split_transfers(true);
  round_trip({1 * MiB, 4, 2, true, false}, 5 * MiB + 8 * KiB, 77);
  round_trip({256 * KiB, 2, 1, false, true}, 7 * MiB, 78);
  zero::io::testing::split_transfers(false);
}

TEST(AioEngine, ReadsWhileWritesOfOtherRegionsAreInFlight) {
  TempDir dir;
  DirectFile file(dir.path() + "/swap", true);
  AioConfig config;
  config.block_size = 256 * KiB;
  config.queue_depth = 4;
  config.thread_count = 2;
  AioEngine engine(config);
  const int64_t region = 4 * MiB;
  AlignedBuffer first(region), second(4 * region), back(region);
  fill(first.data(), region, 0, 11);
  engine.wait(engine.write(file, first.data(), region, 0));

  // Writes of [region, 5 region) in flight, as many requests; a read of
  // [0, region) among them.
  fill(second.data(), 4 * region, region, 12);
  std::vector<AioEngine::Ticket> writes;
  for (int64_t at = 0; at < 4 * region; at += 512 * KiB) {
    writes.push_back(engine.write(file, static_cast<char*>(second.data()) + at, 512 * KiB, region + at));
    if (at == 2 * region) {
      std::memset(back.data(), 0, static_cast<size_t>(region));
      const auto read = engine.read(file, back.data(), region, 0);
      engine.wait(read);
      EXPECT_EQ(std::memcmp(back.data(), first.data(), static_cast<size_t>(region)), 0);
    }
  }
  for (auto t : writes) engine.wait(t);
  const auto plain = plain_read(file.path(), region, 4 * region);
  EXPECT_EQ(std::memcmp(plain.data(), second.data(), static_cast<size_t>(4 * region)), 0);
}

TEST(AioEngine, UnalignedRequestsRefusedNamingTheValue) {
  TempDir dir;
  DirectFile file(dir.path() + "/swap", true);
  AioEngine engine(AioConfig{});
  AlignedBuffer buf(64 * KiB);
  auto* p = static_cast<char*>(buf.data());
  auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(not refused)";
  };
  const std::string b = message([&] { engine.write(file, p + 512, 8 * KiB, 0); });
  EXPECT_NE(b.find("buffer address"), std::string::npos) << b;
  EXPECT_NE(b.find(file.path()), std::string::npos) << b;
  const std::string o = message([&] { engine.read(file, p, 8 * KiB, 1000); });
  EXPECT_NE(o.find("offset 1000 is not a multiple of 4096"), std::string::npos) << o;
  const std::string l = message([&] { engine.write(file, p, 5000, 0); });
  EXPECT_NE(l.find("length 5000 is not a multiple of 4096"), std::string::npos) << l;
  const std::string n = message([&] { engine.read(file, p, 4 * KiB, -4096); });
  EXPECT_NE(n.find("offset -4096 is negative"), std::string::npos) << n;

  AioConfig bad;
  bad.block_size = 1000;
  const std::string c = message([&] { AioEngine e(bad); });
  EXPECT_NE(c.find("aio.block_size 1000"), std::string::npos) << c;
  bad = AioConfig{};
  bad.queue_depth = 0;
  const std::string q = message([&] { AioEngine e(bad); });
  EXPECT_NE(q.find("aio.queue_depth 0"), std::string::npos) << q;
  const std::string t = message([&] { engine.wait(12345); });
  EXPECT_NE(t.find("ticket 12345"), std::string::npos) << t;
  engine.wait_all();  // nothing was queued by the refused calls
}

TEST(AioEngine, ReadPastTheEndIsAnErrorNamingFileAndOffset) {
  TempDir dir;
  DirectFile file(dir.path() + "/swap", true);
  AioConfig config;
  config.block_size = 8 * MiB;  // one piece: the kernel answers short, the rest is asked again and gets 0
  AioEngine engine(config);
  AlignedBuffer buf(8 * MiB);
  fill(buf.data(), 4 * MiB, 0, 5);
  engine.wait(engine.write(file, buf.data(), 4 * MiB, 0));
  const auto t = engine.read(file, buf.data(), 8 * MiB, 0);
  try {
    engine.wait(t);
    FAIL() << "a read past the end succeeded";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.error_number(), ENODATA);
    EXPECT_NE(m.find(file.path()), std::string::npos) << m;
    EXPECT_NE(m.find("at offset 4194304"), std::string::npos) << m;  // the rest, resubmitted
  }
  // A file whose end is not on a block: the short answer names where it ends.
  const std::string odd = dir.path() + "/odd";
  {
    const int fd = ::open(odd.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, buf.data(), 6000), 6000);
    ::close(fd);
  }
  DirectFile f2(odd, false);
  try {
    engine.wait(engine.read(f2, buf.data(), 8 * KiB, 0));
    FAIL() << "a read past the end succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("ends at byte 6000"), std::string::npos) << e.what();
  }
}

TEST(DirectFile, MissingDirectoryNamed) {
  TempDir dir;
  const std::string missing = dir.path() + "/no/such";
  try {
    DirectFile f(missing + "/swap", true);
    FAIL() << "opened a file in a missing directory";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.error_number(), ENOENT);
    EXPECT_NE(m.find("the directory " + missing + " does not exist"), std::string::npos) << m;
  }
}

TEST(DirectFile, ReadOnlyDirectoryNamed) {
  TempDir dir;
  const std::string ro = dir.path() + "/ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0755), 0);
  bool mounted = false;
  if (::geteuid() == 0) {
    // Root writes anywhere a mode allows nothing: a read-only bind mount.
    if (::mount(ro.c_str(), ro.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      GTEST_SKIP() << "cannot bind-mount " << ro << ": " << std::strerror(errno);
    }
    mounted = true;
    if (::mount(nullptr, ro.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) {
      const int err = errno;
      ::umount2(ro.c_str(), MNT_DETACH);
      GTEST_SKIP() << "cannot remount " << ro << " read-only: " << std::strerror(err);
    }
  } else {
    ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  }
  std::string m = "(opened)";
  int err = 0;
  try {
    DirectFile f(ro + "/swap", true);
  } catch (const IoError& e) {
    m = e.what();
    err = e.error_number();
  }
  if (mounted) ::umount2(ro.c_str(), MNT_DETACH);
  EXPECT_TRUE(err == EROFS || err == EACCES) << err;
  EXPECT_NE(m.find("the directory " + ro + " is not writable"), std::string::npos) << m;
}

TEST(DirectFile, ScratchFileUnlinkedOnClose) {
  TempDir dir;
  const std::string scratch = dir.path() + "/scratch", kept = dir.path() + "/kept";
  {
    DirectFile a(scratch, true);
    DirectFile b(kept, false);
    a.reserve(1 * MiB);
    struct stat st {};
    ASSERT_EQ(::stat(scratch.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 1 * MiB);
  }
  EXPECT_FALSE(std::filesystem::exists(scratch));
  EXPECT_TRUE(std::filesystem::exists(kept));
}

// A small ext4 image loop-mounted under a temp directory (root only).
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& dir) : image_(dir + "/disk.img"), mnt_(dir + "/mnt") {
    ::mkdir(mnt_.c_str(), 0755);
    const std::string mk = "truncate -s 8M " + image_ + " && mkfs.ext4 -q -F -O ^has_journal " + image_ +
                           " >/dev/null 2>&1 && mount -o loop " + image_ + " " + mnt_ + " 2>/dev/null";
    if (std::system(mk.c_str()) == 0) mounted_ = true;
  }
  ~SmallDisk() {
    if (mounted_) {
      const std::string um = "umount " + mnt_ + " 2>/dev/null || umount -l " + mnt_;
      if (std::system(um.c_str()) != 0) std::fprintf(stderr, "could not unmount %s\n", mnt_.c_str());
    }
  }
  bool mounted() const { return mounted_; }
  const std::string& mnt() const { return mnt_; }

 private:
  std::string image_, mnt_;
  bool mounted_ = false;
};

TEST(AioEngine, FullDiskIsIoErrorNamingTheFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small filesystem to fill needs root";
  TempDir dir;
  SmallDisk disk(dir.path());
  if (!disk.mounted()) GTEST_SKIP() << "could not make and loop-mount an 8 MiB ext4 image (mkfs.ext4, mount -o loop)";
  {
    const std::string path = disk.mnt() + "/swap";
    DirectFile file(path, true);
    // reserve() finds the full disk before any I/O.
    try {
      file.reserve(64 * MiB);
      ADD_FAILURE() << "reserved 64 MiB on an 8 MiB disk";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_number(), ENOSPC);
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the disk is full"), std::string::npos) << e.what();
    }
    // Writes past the space: the failure surfaces at wait().
    AioConfig config;
    config.block_size = 1 * MiB;
    config.thread_count = 2;
    AioEngine engine(config);
    AlignedBuffer buf(16 * MiB);
    fill(buf.data(), 16 * MiB, 0, 9);
    const auto t = engine.write(file, buf.data(), 16 * MiB, 0);
    try {
      engine.wait(t);
      ADD_FAILURE() << "wrote 16 MiB to an 8 MiB disk";
    } catch (const IoError& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.error_number(), ENOSPC) << m;
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("at offset "), std::string::npos) << m;
      EXPECT_NE(m.find("the disk is full"), std::string::npos) << m;
    }
    // The engine goes on serving after a failure.
    engine.wait(engine.read(file, buf.data(), 1 * MiB, 0));
  }
}

TEST(AioEngine, DestructorWithRequestsInFlightWaitsAndLeaksNothing) {
  TempDir dir;
  const int fds_before = count_entries("/proc/self/fd");
  const int threads_before = count_entries("/proc/self/task");
  const int64_t total = 32 * MiB;
  AlignedBuffer out(total), in(total);
  fill(out.data(), total, 0, 21);
  {
    DirectFile file(dir.path() + "/kept", false);
    {
      AioConfig config;
      config.block_size = 128 * KiB;
      config.queue_depth = 2;
      config.thread_count = 2;
      AioEngine engine(config);
      for (int64_t at = 0; at < total; at += 1 * MiB) {
        engine.write(file, static_cast<char*>(out.data()) + at, 1 * MiB, at);
      }
      // Gone with all of it in flight, none waited for.
    }
    const auto plain = plain_read(file.path(), 0, total);
    EXPECT_EQ(std::memcmp(plain.data(), out.data(), static_cast<size_t>(total)), 0)
        << "the destructor did not wait for the writes in flight";
    AlignedBuffer other(8 * MiB);  // outlives the engine, as buffers in flight must
    {
      AioEngine engine(AioConfig{});
      engine.read(file, in.data(), total, 0);
      engine.read(file, other.data(), 8 * MiB, 4 * MiB);
    }
    EXPECT_EQ(std::memcmp(in.data(), out.data(), static_cast<size_t>(total)), 0);
  }
  EXPECT_EQ(count_entries("/proc/self/fd"), fds_before) << "descriptors (rings, files) left open";
  EXPECT_EQ(count_entries("/proc/self/task"), threads_before) << "worker threads left running";
}

TEST(AlignedBuffer, AlignedRoundedAndMovable) {
  AlignedBuffer a(5000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kAlignment, 0u);
  EXPECT_EQ(a.bytes(), 8192);
  void* p = a.data();
  AlignedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(AlignedBuffer().bytes(), 0);
}

}  // namespace

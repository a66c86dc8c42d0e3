#include "ckpt/safetensors.h"

#include <algorithm>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

namespace zero::ckpt {

namespace {

[[noreturn]] void io_error(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

void write_all(int fd, const void* p, int64_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      io_error("cannot write", path);
    }
    c += w;
    n -= w;
  }
}

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

// Incremental form of hash64, so a file can be hashed as it is written.
struct Hasher {
  uint64_t h;
  int64_t total = 0;
  unsigned char tail[8];
  int tail_n = 0;
  explicit Hasher(uint64_t seed) : h(seed ^ 0x9e3779b97f4a7c15ULL) {}
  void word(uint64_t w) { h = (h ^ mix(w)) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL; }
  void add(const void* data, int64_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    total += n;
    while (tail_n && n) {
      tail[tail_n++] = *p++, --n;
      if (tail_n == 8) {
        uint64_t w;
        std::memcpy(&w, tail, 8);
        word(w);
        tail_n = 0;
      }
    }
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      word(w);
    }
    while (n--) tail[tail_n++] = *p++;
  }
  uint64_t finish() {
    uint64_t w = 0;
    std::memcpy(&w, tail, tail_n);
    word(w ^ (static_cast<uint64_t>(tail_n) << 56));
    return mix(h ^ static_cast<uint64_t>(total));
  }
};

}  // namespace

uint64_t hash64(const void* data, int64_t bytes, uint64_t seed) {
  Hasher h(seed);
  h.add(data, bytes);
  return h.finish();
}

int64_t dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  throw std::invalid_argument("safetensors: unknown dtype " + d);
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            const void* data) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const int64_t bytes = n * dtype_size(dtype);
  items_.push_back({name, {dtype, std::move(shape), data_bytes_, data_bytes_ + bytes}, data});
  data_bytes_ += bytes;
}

struct SafetensorsWriter::Stream {
  std::string path;
  int fd = -1;
  Hasher hash{0};
  void put(const void* data, int64_t bytes) {
    write_all(fd, data, bytes, path);
    hash.add(data, bytes);
  }
  ~Stream() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsWriter::SafetensorsWriter() = default;
SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::open(const std::string& path) {
  if (stream_) throw std::logic_error("SafetensorsWriter::open: " + stream_->path + " is still open");
  nlohmann::json header = nlohmann::json::object();
  for (const auto& it : items_)
    header[it.name] = {{"dtype", it.entry.dtype}, {"shape", it.entry.shape},
                       {"data_offsets", {it.entry.begin, it.entry.end}}};
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));

  auto stream = std::make_unique<Stream>();
  stream->path = path;
  stream->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (stream->fd < 0) io_error("cannot create", path);
  stream->put(len, 8);  // a failure closes the file (Stream's destructor)
  stream->put(text.data(), static_cast<int64_t>(n));
  stream_ = std::move(stream);
  next_ = 0;
}

void SafetensorsWriter::write_next(const void* data) {
  if (!stream_) throw std::logic_error("SafetensorsWriter::write_next: no file is open");
  if (next_ >= items_.size())
    throw std::logic_error("SafetensorsWriter::write_next: every tensor of " + stream_->path + " is written already");
  const auto& e = items_[next_].entry;
  try {
    stream_->put(data, e.end - e.begin);
  } catch (...) {
    stream_.reset();  // the file is incomplete: closed, never finished
    throw;
  }
  ++next_;
}

FileDigest SafetensorsWriter::finish() {
  if (!stream_) throw std::logic_error("SafetensorsWriter::finish: no file is open");
  const std::unique_ptr<Stream> stream = std::move(stream_);
  if (next_ != items_.size())
    throw std::logic_error("SafetensorsWriter::finish: " + stream->path + " lacks tensor '" + items_[next_].name +
                           "' and the rest after it");
  if (::fsync(stream->fd) != 0) io_error("cannot fsync", stream->path);
  const int fd = std::exchange(stream->fd, -1);
  if (::close(fd) != 0) io_error("cannot close", stream->path);
  return {stream->hash.total, stream->hash.finish()};
}

FileDigest SafetensorsWriter::write(const std::string& path) {
  open(path);
  for (const auto& it : items_) write_next(it.data);
  return finish();
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("cannot open", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    io_error("cannot stat", path);
  }
  size_ = st.st_size;
  if (size_ > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) io_error("cannot map", path);
    map_ = static_cast<char*>(p);
  } else {
    ::close(fd);
  }
  auto bad = [&](const std::string& why) {
    if (map_) munmap(map_, static_cast<size_t>(size_));
    map_ = nullptr;
    throw std::runtime_error("checkpoint file " + path + " is truncated or corrupt: " + why);
  };
  if (size_ < 8) bad("shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(map_[i]);
  if (n > static_cast<uint64_t>(size_ - 8)) bad("the header runs past the end of the file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + 8 + n);
  } catch (const std::exception& e) {
    bad(std::string("unreadable header: ") + e.what());
  }
  data_ = map_ + 8 + n;
  const int64_t data_size = size_ - 8 - static_cast<int64_t>(n);
  std::string problem;
  try {
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, val] : v.items()) metadata_[k] = val.get<std::string>();
        continue;
      }
      TensorEntry e;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      e.begin = v.at("data_offsets").at(0).get<int64_t>();
      e.end = v.at("data_offsets").at(1).get<int64_t>();
      int64_t numel = 1;
      for (int64_t s : e.shape) {
        if (s < 0 || (s > 0 && numel > (int64_t{1} << 50) / s)) throw std::runtime_error("tensor " + name + " has a bad shape");
        numel *= s;
      }
      if (e.begin < 0 || e.end < e.begin || e.end - e.begin != numel * dtype_size(e.dtype))
        throw std::runtime_error("tensor " + name + " has inconsistent offsets");
      if (e.end > data_size) throw std::runtime_error("tensor " + name + " runs past the end of the file");
      entries_[name] = std::move(e);
    }
  } catch (const std::exception& e) {  // json type errors, unknown dtypes, the checks above
    problem = e.what();
  }
  if (!problem.empty()) bad(problem);
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, static_cast<size_t>(size_));
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::runtime_error("checkpoint file " + path_ + " has no tensor " + name);
  return it->second;
}

uint64_t SafetensorsFile::hash() const { return hash64(map_, size_); }

}  // namespace zero::ckpt

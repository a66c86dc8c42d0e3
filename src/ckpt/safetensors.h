// The safetensors format (https://github.com/huggingface/safetensors): an
// 8-byte little-endian header length, a JSON header mapping each tensor name
// to {dtype, shape, data_offsets: [begin, end)} (offsets relative to the
// data after the header) plus an optional "__metadata__" object of strings,
// then the raw little-endian data. Small enough to write here; read by any
// safetensors reader (Python's `safetensors`, or the standard library +
// numpy). No torch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zero::ckpt {

struct TensorEntry {
  std::string dtype;           // "F32", "BF16", "F16", "F64", "I64", ...
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte range within the data section
};

int64_t dtype_size(const std::string& dtype);  // throws for an unknown dtype

// What a finished write produced: the file's size and content hash.
struct FileDigest {
  int64_t bytes = 0;
  uint64_t hash = 0;
};

// Collects tensors (pointers, not copies: they must stay valid until
// write()) and writes them in one pass.
class SafetensorsWriter {
 public:
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes `path`, fsyncs it, and returns its size and hash (hash64 of
  // every byte). Throws std::runtime_error naming the path on any failure.
  FileDigest write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    TensorEntry entry;
    const void* data;
  };
  std::vector<Item> items_;
  int64_t data_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file mapped read-only. Every tensor's range is checked
// against the file size at open, so a truncated file is an error naming it.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;  // throws naming the file and tensor
  const char* data(const std::string& name) const { return data_ + entry(name).begin; }
  const std::map<std::string, TensorEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  int64_t file_bytes() const { return size_; }
  uint64_t hash() const;  // hash64 of the whole file

 private:
  std::string path_;
  char* map_ = nullptr;
  int64_t size_ = 0;
  const char* data_ = nullptr;
  std::map<std::string, TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A fast 64-bit content hash (8 bytes per step, multiply-xorshift mixing):
// detects truncation and corruption, not adversaries.
uint64_t hash64(const void* data, int64_t bytes, uint64_t seed = 0);

}  // namespace zero::ckpt

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
#include <memory>
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
// write()) and writes them in one pass. Or streams them: the header needs
// only names, dtypes and shapes, so open() writes it once every tensor is
// added (data may then be null) and write_next() takes each tensor's bytes
// in the order they were added -- a checkpoint of state on NVMe pages in
// one group at a time instead of holding it all.
class SafetensorsWriter {
 public:
  SafetensorsWriter();
  ~SafetensorsWriter();  // closes a stream left unfinished (the file stays, incomplete)
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes `path`, fsyncs it, and returns its size and hash (hash64 of
  // every byte). Throws std::runtime_error naming the path on any failure.
  FileDigest write(const std::string& path);

  // Streaming: creates `path` and writes the header.
  void open(const std::string& path);
  // The bytes of the next tensor in the order added.
  void write_next(const void* data);
  // Fsyncs and closes; throws (naming the path and the first tensor not
  // written) unless every tensor was written.
  FileDigest finish();

 private:
  struct Item {
    std::string name;
    TensorEntry entry;
    const void* data;
  };
  struct Stream;  // the open file and its running hash
  std::vector<Item> items_;
  int64_t data_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<Stream> stream_;
  size_t next_ = 0;  // streaming: the item write_next() writes
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

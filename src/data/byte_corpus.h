// Training data for the bundled GPT: a text read as bytes (byte tokens, so
// no tokenizer download), sampled deterministically and independently of
// the world size: the global batch of step t is the same sequences whatever
// N is, and each rank takes its contiguous slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::data {

class ByteCorpus {
 public:
  // A file, or a directory whose regular files are concatenated in name order.
  static ByteCorpus load(const std::string& path);
  // The license texts every Debian machine has (/usr/share/common-licenses).
  static std::string default_path() { return "/usr/share/common-licenses"; }

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& source() const { return source_; }

  // Start offsets of the global batch of optimizer step `step`: global_batch
  // windows of seq_len + 1 bytes, drawn from a generator seeded by (seed, step).
  std::vector<int64_t> step_offsets(int64_t step, int64_t global_batch, int64_t seq_len, uint64_t seed) const;

  // Tokens of the windows at `offsets`, row-major [offsets.size(), seq_len + 1].
  std::vector<int64_t> windows(const std::vector<int64_t>& offsets, int64_t seq_len) const;

 private:
  std::vector<uint8_t> bytes_;
  std::string source_;
};

// The sequences (indices into a step's global batch) one rank uses for one
// micro-step: micro-step j of rank r takes [(j * dp + r) * micro, + micro).
inline int64_t micro_batch_begin(int64_t micro_step, int64_t dp_rank, int64_t dp_size, int64_t micro_batch) {
  return (micro_step * dp_size + dp_rank) * micro_batch;
}

}  // namespace zero::data

#include "data/byte_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <system_error>

namespace zero::data {

namespace fs = std::filesystem;

ByteCorpus ByteCorpus::load(const std::string& path) {
  ByteCorpus c;
  c.source_ = path;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("data: cannot read " + f.string());
    c.bytes_.insert(c.bytes_.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (c.bytes_.empty()) throw std::runtime_error("data: " + path + " is empty");
  return c;
}

std::vector<int64_t> ByteCorpus::step_offsets(int64_t step, int64_t global_batch, int64_t seq_len,
                                              uint64_t seed) const {
  const int64_t span = size() - (seq_len + 1);
  if (span <= 0)
    throw std::runtime_error("data: " + source_ + " has " + std::to_string(size()) +
                             " bytes, fewer than seq_len + 1 = " + std::to_string(seq_len + 1));
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step));
  std::uniform_int_distribution<int64_t> pick(0, span);
  std::vector<int64_t> out(global_batch);
  for (auto& o : out) o = pick(gen);
  return out;
}

std::vector<int64_t> ByteCorpus::windows(const std::vector<int64_t>& offsets, int64_t seq_len) const {
  std::vector<int64_t> out;
  out.reserve(offsets.size() * (seq_len + 1));
  for (int64_t o : offsets)
    for (int64_t i = 0; i <= seq_len; ++i) out.push_back(bytes_[o + i]);
  return out;
}

}  // namespace zero::data

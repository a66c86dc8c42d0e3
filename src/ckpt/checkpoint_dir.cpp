#include "ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <linux/fs.h>  // RENAME_EXCHANGE
#include <system_error>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/half_bits.h"

namespace zero::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

std::string tensor_name(const std::string& param, const std::string& kind) { return param + "/" + kind; }
std::string rank_file_name(int rank) { return "rank_" + std::to_string(rank) + ".safetensors"; }
std::string partial_dir(const std::string& dir, const std::string& tag) { return dir + "/.partial-" + tag; }

std::string resolve_tag(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".partial-", 0) == 0)
      std::fprintf(stderr, "zero-cpp: warning: ignoring %s, a checkpoint save that did not finish\n",
                   e.path().c_str());
  }
  if (ec) throw std::runtime_error("checkpoint directory " + dir + ": " + ec.message());
  if (!tag.empty()) return tag;
  std::ifstream f(dir + "/latest");
  std::string t;
  if (!(f >> t)) throw std::runtime_error("checkpoint directory " + dir + " has no complete checkpoint (no 'latest')");
  return t;
}

CheckpointReader::CheckpointReader(const std::string& dir, const std::string& tag) {
  path_ = dir + "/" + resolve_tag(dir, tag);
  const std::string mpath = path_ + "/manifest.json";
  std::ifstream f(mpath);
  if (!f) {
    std::error_code ec;
    // DeepSpeed's model states: one file below stage 3, one per rank at stage 3.
    for (const char* file : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"})
      if (std::filesystem::exists(path_ + "/" + file, ec))
        throw std::runtime_error(
            "checkpoint " + path_ + " was written by DeepSpeed (" + file + "), not by zero-cpp: convert it "
            "first (python -m zero_cpp.deepspeed_checkpoint DIR OUT_DIR, which writes a zero-cpp checkpoint "
            "with the weights, Adam's moments, counters and scheduler; the Python front end's "
            "load_checkpoint converts it itself)");
    throw std::runtime_error("checkpoint " + path_ + " has no manifest.json (not a finished save?)");
  }
  json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint manifest " + mpath + " is truncated or corrupt: " + e.what());
  }
  manifest_ = Manifest::from_json(j, mpath);
  for (size_t i = 0; i < manifest_.params.size(); ++i) index_[manifest_.params[i].name] = i;
  for (size_t i = 0; i < manifest_.replicated.size(); ++i) replicated_index_[manifest_.replicated[i].name] = i;
}

const ReplicatedRecord* CheckpointReader::find_replicated(const std::string& name) const {
  auto it = replicated_index_.find(name);
  return it == replicated_index_.end() ? nullptr : &manifest_.replicated[it->second];
}

const char* CheckpointReader::replicated_data(const std::string& name) {
  const ReplicatedRecord* r = find_replicated(name);
  if (!r) throw std::runtime_error("checkpoint " + path_ + " has no frozen param or buffer " + name);
  const SafetensorsFile& f = file(0);
  const std::string t = tensor_name(name, "value");
  const TensorEntry& e = f.entry(t);
  if (e.dtype != r->dtype || e.shape != r->shape)
    throw std::runtime_error("checkpoint file " + f.path() + ": tensor " + t + " does not match the manifest");
  return f.data(t);
}

const ParamRecord* CheckpointReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &manifest_.params[it->second];
}

const SafetensorsFile& CheckpointReader::file(int rank) {
  auto& slot = files_[rank];
  if (slot) return *slot;
  auto it = manifest_.files.find(rank);
  if (it == manifest_.files.end())
    throw std::runtime_error("checkpoint " + path_ + ": the manifest lists no file for rank " + std::to_string(rank));
  const std::string p = path_ + "/" + it->second.file;
  auto f = std::make_unique<SafetensorsFile>(p);
  if (f->file_bytes() != it->second.bytes)
    throw std::runtime_error("checkpoint file " + p + " is truncated or corrupt: " + std::to_string(f->file_bytes()) +
                             " bytes, the manifest says " + std::to_string(it->second.bytes));
  if (f->hash() != it->second.hash)
    throw std::runtime_error("checkpoint file " + p + " is corrupt: its content hash differs from the manifest's");
  slot = std::move(f);
  return *slot;
}

void CheckpointReader::read(const std::string& name, const std::string& kind, int64_t begin, int64_t end,
                            float* out) {
  const ParamRecord* p = find(name);
  if (!p) throw std::runtime_error("checkpoint " + path_ + " has no param " + name);
  for (const auto& fr : p->fragments) {
    const int64_t lo = std::max(begin, fr.begin), hi = std::min(end, fr.end);
    if (lo >= hi) continue;
    const SafetensorsFile& f = file(fr.rank);
    const std::string t = tensor_name(name, kind);
    const TensorEntry& e = f.entry(t);
    if (e.dtype != "F32" || (e.end - e.begin) / 4 != fr.end - fr.begin)
      throw std::runtime_error("checkpoint file " + f.path() + ": tensor " + t + " does not match the manifest");
    std::memcpy(out + (lo - begin), reinterpret_cast<const float*>(f.data(t)) + (lo - fr.begin),
                static_cast<size_t>(hi - lo) * 4);
  }
}

void consolidate(const std::string& dir, const std::string& tag, const std::string& out, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16") throw std::invalid_argument("consolidate: --dtype must be fp32 or bf16");
  CheckpointReader r(dir, tag);
  std::vector<std::vector<float>> full;
  std::vector<std::vector<uint16_t>> half;
  SafetensorsWriter w;
  for (const auto& p : r.manifest().params) {
    full.emplace_back(static_cast<size_t>(p.numel));
    r.read(p.name, "master", 0, p.numel, full.back().data());
    if (dtype == "bf16") {
      half.emplace_back(full.back().size());
      for (size_t i = 0; i < half.back().size(); ++i) half.back()[i] = bits::to_bf16(full.back()[i]);
      full.back() = {};
      w.add(p.name, "BF16", p.shape, half.back().data());
    } else {
      w.add(p.name, "F32", p.shape, full.back().data());
    }
  }
  // Frozen params and buffers as saved (float32 ones rounded to bf16 when asked).
  for (const auto& rec : r.manifest().replicated) {
    const char* data = r.replicated_data(rec.name);
    if (dtype == "bf16" && rec.dtype == "F32") {
      int64_t n = 1;
      for (int64_t d : rec.shape) n *= d;
      half.emplace_back(static_cast<size_t>(n));
      const auto* src = reinterpret_cast<const float*>(data);
      for (int64_t i = 0; i < n; ++i) half.back()[i] = bits::to_bf16(src[i]);
      w.add(rec.name, "BF16", rec.shape, half.back().data());
    } else {
      w.add(rec.name, rec.dtype, rec.shape, data);
    }
  }
  w.set_metadata("format", "pt");
  w.set_metadata("source", "zero-cpp checkpoint " + r.path());
  const std::string tmp = out + ".tmp";
  w.write(tmp);
  if (std::rename(tmp.c_str(), out.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp + " to " + out + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error("cannot fsync " + path + ": " + std::strerror(errno));
}

void write_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  std::string error;
  for (size_t done = 0; done < text.size();) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      error = "cannot write " + path + ": " + (w < 0 ? std::strerror(errno) : "no progress");
      break;
    }
    done += static_cast<size_t>(w);
  }
  if (error.empty() && ::fsync(fd) != 0) error = "cannot fsync " + path + ": " + std::strerror(errno);
  if (::close(fd) != 0 && error.empty()) error = "cannot close " + path + ": " + std::strerror(errno);
  if (!error.empty()) throw std::runtime_error(error);
}

std::string discard_save(const std::string& dir, const std::string& tag) {
  std::string left;
  for (const std::string& p : {partial_dir(dir, tag), dir + "/latest.tmp"}) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (ec) left += (left.empty() ? "" : "; ") + std::string("could not remove ") + p + ": " + ec.message();
  }
  return left;
}

void publish(const std::string& dir, const std::string& tag) {
  const std::string final_dir = dir + "/" + tag, partial = partial_dir(dir, tag), old = dir + "/.old-" + tag;
  const std::string latest_tmp = dir + "/latest.tmp";
  write_file(latest_tmp, tag + "\n");  // the last write that needs space, before anything moves
  fs::remove_all(old);
  if (!fs::exists(final_dir)) {
    fs::rename(partial, final_dir);
  } else if (renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    // A re-save of the tag: swapped in one step, so DIR/TAG always holds a
    // complete checkpoint; the partial name now holds the old one.
    fsync_path(dir);
    fs::remove_all(partial);
  } else {
    // A filesystem without RENAME_EXCHANGE: two renames, with a window
    // where only .old-TAG holds the previous copy.
    fs::rename(final_dir, old);
    fs::rename(partial, final_dir);
  }
  fsync_path(dir);
  fs::rename(latest_tmp, dir + "/latest");
  fsync_path(dir);
  fs::remove_all(old);
}

}  // namespace zero::ckpt

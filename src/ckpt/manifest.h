// A checkpoint's manifest.json: which rank file holds which element range
// of which param, each file's size and hash, and the run's state. Reading
// one checks everything a reader would otherwise trust: the manifest's own
// hash, and that its params, fragments and files are consistent (see
// validate()), so no reader copies past a buffer or leaves elements unread.
// No torch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::ckpt {

// Version 2 added "manifest_hash". A version-2 manifest must carry it (so a
// damaged key cannot switch the check off); version-1 manifests, written
// before the hash existed, still load without one. A hash that is present is
// checked whatever the version says (a flipped bit can turn 2 into 1).
constexpr int kFormatVersion = 2;
constexpr int kOldestFormatVersion = 1;

struct Fragment {
  int rank = 0;
  int64_t begin = 0, end = 0;  // element range of the flattened param
};

struct ParamRecord {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  std::vector<Fragment> fragments;  // cover [0, numel) exactly once
};

// A frozen param or buffer (replicated on every rank): saved whole by rank 0.
struct ReplicatedRecord {
  std::string name;
  std::string kind;   // "param" (frozen) or "buffer"
  std::string dtype;  // safetensors dtype, e.g. "F32", "I64"
  std::vector<int64_t> shape;
};

struct RankFile {
  std::string file;  // relative to the tag directory
  int64_t bytes = 0;
  uint64_t hash = 0;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string tag;
  int world_size = 1;
  int dp_size = 1;
  int stage = 0;
  std::string dtype;             // params' dtype when saved
  std::vector<std::string> kinds;  // state kinds stored per param ("master", ...)
  nlohmann::json config;         // the ds_config, as parsed
  nlohmann::json engine_state;   // step counters, loss scaler, scheduler
  nlohmann::json client_state;   // the caller's (e.g. zero-train's data position)
  std::vector<ParamRecord> params;
  std::vector<ReplicatedRecord> replicated;  // in rank 0's file
  std::map<int, RankFile> files;  // by rank; ranks without fragments write none

  // Validates, then adds "manifest_hash" over everything else.
  nlohmann::json to_json() const;
  // Checks the hash, parses, validates; errors name `where` (the file).
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

// The hash of a manifest's JSON: hash64 of the compact dump without the
// "manifest_hash" key (object keys dump sorted, so the text is canonical and
// any section a later version adds is covered without listing it here).
uint64_t manifest_hash(const nlohmann::json& j);

// Throws std::runtime_error naming the param or rank and the problem when:
// a size is negative; numel differs from the product of the shape (or that
// product overflows); a param's fragments do not tile [0, numel) exactly
// once (gap, overlap, out of range, begin >= end); a fragment or file names a
// rank outside [0, world_size); a fragment's rank has no file; a name
// repeats (params and frozen params/buffers share one namespace); a file
// name leaves the tag directory; a frozen param or buffer has an unknown
// kind or dtype, a shape whose byte size overflows, or no rank-0 file.
void validate(const Manifest& m);

}  // namespace zero::ckpt

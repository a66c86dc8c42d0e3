// A checkpoint on disk, without torch: the manifest, the per-rank shard
// files, reading any element range of any param back (whatever world size
// and stage wrote it), consolidation, and the atomic publish.
//
//   DIR/latest                      the newest complete tag (one line)
//   DIR/TAG/manifest.json           written last, by rank 0
//   DIR/TAG/rank_R.safetensors      rank R's fragments: tensor "<param>/<kind>"
//                                   holds elements [begin, end) of the
//                                   flattened param, kind master | exp_avg | exp_avg_sq (fp32);
//                                   rank 0's also "<name>/value": each frozen
//                                   param and buffer whole, in its own dtype
//                                   (a 16-bit floating one widened to fp32)
//   DIR/.partial-TAG/               a save in progress (or one that died)
//
// The manifest (ckpt/manifest.h) records, per param, its shape and which rank
// file holds which range, and per file its size and hash, so a reader can
// fetch any range (resharding is reading other ranges) and detect truncation
// or corruption.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"

namespace zero::ckpt {

std::string tensor_name(const std::string& param, const std::string& kind);
std::string rank_file_name(int rank);

// The tag `latest` names, or `tag` itself when given. Throws when there is
// no complete checkpoint; warns (stderr) about partial saves it skips.
std::string resolve_tag(const std::string& dir, const std::string& tag);

class CheckpointReader {
 public:
  CheckpointReader(const std::string& dir, const std::string& tag);  // tag "" = latest
  const Manifest& manifest() const { return manifest_; }
  const std::string& path() const { return path_; }
  const ParamRecord* find(const std::string& name) const;
  // Copies elements [begin, end) of `kind` of param `name` into out (fp32).
  void read(const std::string& name, const std::string& kind, int64_t begin, int64_t end, float* out);
  const ReplicatedRecord* find_replicated(const std::string& name) const;
  // A frozen param's or buffer's bytes, whole, in the dtype its record names.
  const char* replicated_data(const std::string& name);

 private:
  const SafetensorsFile& file(int rank);  // opened on first use; size and hash checked
  std::string path_;
  Manifest manifest_;
  std::map<std::string, size_t> index_;
  std::map<std::string, size_t> replicated_index_;
  std::map<int, std::unique_ptr<SafetensorsFile>> files_;
};

// Full fp32 (or bf16) weights by param name, one safetensors file.
void consolidate(const std::string& dir, const std::string& tag, const std::string& out, const std::string& dtype);

// Directory helpers for the atomic save.
std::string partial_dir(const std::string& dir, const std::string& tag);
void fsync_path(const std::string& path);  // a file or a directory
// Writes `text` to `path` (created or truncated) and fsyncs it; throws
// naming the path and the system's reason (e.g. "No space left on device").
void write_file(const std::string& path, const std::string& text);
// Moves a finished partial directory into place as DIR/TAG (an older one of
// the same tag is swapped out atomically with RENAME_EXCHANGE), then points
// `latest` at it; each step is a rename followed by an fsync of DIR, so a
// crash leaves the old checkpoint or the new one. `latest`'s new copy
// (DIR/latest.tmp) is written first, so a full disk fails before anything
// was moved; what can fail after the move is a rename or an fsync.
void publish(const std::string& dir, const std::string& tag);
// Removes what a save of `tag` that failed wrote: DIR/.partial-TAG and
// DIR/latest.tmp. Returns "" or what could not be removed, and why.
std::string discard_save(const std::string& dir, const std::string& tag);

}  // namespace zero::ckpt

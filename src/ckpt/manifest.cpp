#include "ckpt/manifest.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <stdexcept>
#include <system_error>

#include "ckpt/safetensors.h"

namespace zero::ckpt {

using nlohmann::json;

namespace {

constexpr const char* kHashKey = "manifest_hash";

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

std::string str(int64_t v) { return std::to_string(v); }

std::string range(int64_t begin, int64_t end) { return "[" + str(begin) + ", " + str(end) + ")"; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + "]";
}

// Whole-string decimal parse: std::stoi would read "1x" as 1.
template <typename T>
T parse_decimal(const std::string& s, const std::string& what) {
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    fail(what + " '" + s + "' is not a decimal number");
  return v;
}

// Product of the dims, or nullopt-like false when it overflows int64. A zero
// dim makes the product 0 whatever the others are, so it is checked first.
bool shape_product(const std::vector<int64_t>& shape, int64_t* out) {
  *out = 1;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    *out = 0;
    return true;
  }
  for (int64_t d : shape)
    if (__builtin_mul_overflow(*out, d, out)) return false;
  return true;
}

void validate_param(const ParamRecord& p, const Manifest& m) {
  const std::string pp = "param '" + p.name + "': ";
  if (p.numel < 0) fail(pp + "numel " + str(p.numel) + " is negative");
  for (int64_t d : p.shape)
    if (d < 0) fail(pp + "shape " + shape_str(p.shape) + " has a negative dimension");
  int64_t product = 0;
  if (!shape_product(p.shape, &product))
    fail(pp + "the product of shape " + shape_str(p.shape) + " overflows int64");
  if (product != p.numel)
    fail(pp + "numel " + str(p.numel) + " differs from the product of shape " + shape_str(p.shape) + " (" +
         str(product) + ")");
  for (const auto& f : p.fragments) {
    const std::string fr = pp + "fragment " + range(f.begin, f.end) + " of rank " + std::to_string(f.rank);
    if (f.rank < 0 || f.rank >= m.world_size)
      fail(fr + " names a rank outside [0, world_size " + std::to_string(m.world_size) + ")");
    if (!m.files.count(f.rank)) fail(fr + " is in a file the manifest does not list (no files entry for that rank)");
    // An empty fragment is allowed only for an empty param: the engine's
    // stage-0 save lists every param whole, [0, 0) for a zero-element one.
    if (f.begin > f.end || (f.begin == f.end && p.numel > 0)) fail(fr + " is empty or reversed (begin >= end)");
    if (f.begin < 0 || f.end > p.numel) fail(fr + " is outside the param's range [0, " + str(p.numel) + ")");
  }
  // Exactly once: sorted by begin, each fragment starts where the covered
  // prefix ends.
  std::vector<Fragment> sorted = p.fragments;
  std::sort(sorted.begin(), sorted.end(),
            [](const Fragment& a, const Fragment& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  int64_t covered = 0;
  for (const auto& f : sorted) {
    if (f.begin > covered) fail(pp + "no fragment covers elements " + range(covered, f.begin));
    if (f.begin < covered)
      fail(pp + "fragments overlap on elements " + range(f.begin, std::min(covered, f.end)) + " (rank " +
           std::to_string(f.rank) + "'s fragment and another)");
    covered = f.end;
  }
  if (covered < p.numel) fail(pp + "no fragment covers elements " + range(covered, p.numel));
}

}  // namespace

uint64_t manifest_hash(const json& j) {
  json body = j;
  body.erase(kHashKey);
  const std::string text = body.dump();
  return hash64(text.data(), static_cast<int64_t>(text.size()));
}

void validate(const Manifest& m) {
  if (m.world_size < 1) fail("world_size " + std::to_string(m.world_size) + " must be >= 1");
  for (const auto& [rank, f] : m.files) {
    const std::string fr = "files: rank " + std::to_string(rank);
    if (rank < 0 || rank >= m.world_size)
      fail(fr + " is outside [0, world_size " + std::to_string(m.world_size) + ")");
    if (f.bytes < 0) fail(fr + ": size " + str(f.bytes) + " is negative");
    if (f.file.empty() || f.file == "." || f.file == ".." || f.file.find('/') != std::string::npos)
      fail(fr + ": '" + f.file + "' is not a file name inside the checkpoint directory");
  }
  std::set<std::string> names;
  for (const auto& p : m.params) {
    if (!names.insert(p.name).second) fail("param '" + p.name + "' is listed twice");
    validate_param(p, m);
  }
  for (const auto& r : m.replicated) {
    const std::string rr = "frozen param or buffer '" + r.name + "': ";
    if (!names.insert(r.name).second) fail(rr + "the name is listed twice");
    if (r.kind != "param" && r.kind != "buffer") fail(rr + "kind '" + r.kind + "' is neither param nor buffer");
    int64_t element_bytes = 0;
    try {
      element_bytes = dtype_size(r.dtype);
    } catch (const std::exception&) {
      fail(rr + "dtype '" + r.dtype + "' is not a safetensors dtype");
    }
    for (int64_t d : r.shape)
      if (d < 0) fail(rr + "shape " + shape_str(r.shape) + " has a negative dimension");
    int64_t numel = 0, bytes = 0;
    if (!shape_product(r.shape, &numel) || __builtin_mul_overflow(numel, element_bytes, &bytes))
      fail(rr + "the byte size of shape " + shape_str(r.shape) + " overflows int64");
    if (!m.files.count(0)) fail(rr + "it is in rank 0's file, which the manifest does not list");
  }
}

json Manifest::to_json() const {
  // A manifest its own reader would reject is a bug of the writer: fail the
  // save rather than publish a checkpoint that cannot load.
  try {
    validate(*this);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint manifest of tag " + tag + " is invalid: " + e.what());
  }
  json ps = json::array();
  for (const auto& p : params) {
    json fr = json::array();
    for (const auto& f : p.fragments) fr.push_back({f.rank, f.begin, f.end});
    ps.push_back({{"name", p.name}, {"shape", p.shape}, {"numel", p.numel}, {"fragments", fr}});
  }
  json rp = json::array();
  for (const auto& r : replicated)
    rp.push_back({{"name", r.name}, {"kind", r.kind}, {"dtype", r.dtype}, {"shape", r.shape}});
  json fl = json::object();
  for (const auto& [r, f] : files)
    fl[std::to_string(r)] = {{"file", f.file}, {"bytes", f.bytes}, {"hash", std::to_string(f.hash)}};
  json j = {{"format", "zero-cpp checkpoint"}, {"format_version", format_version}, {"tag", tag},
            {"world_size", world_size}, {"dp_size", dp_size}, {"stage", stage}, {"dtype", dtype},
            {"kinds", kinds}, {"config", config}, {"engine_state", engine_state},
            {"client_state", client_state}, {"params", ps}, {"replicated", rp}, {"files", fl}};
  j[kHashKey] = std::to_string(manifest_hash(j));
  return j;
}

Manifest Manifest::from_json(const json& j, const std::string& where) {
  const std::string what = "checkpoint manifest " + where;
  if (!j.is_object()) fail(what + " is not readable: not a JSON object");
  // The hash first: a damaged manifest is reported as damaged, not as
  // whichever field the damage happened to hit.
  const json* h = j.contains(kHashKey) ? &j.at(kHashKey) : nullptr;
  if (h) {
    if (!h->is_string()) fail(what + " is corrupt: " + kHashKey + " is not a string");
    uint64_t recorded = 0;
    try {
      recorded = parse_decimal<uint64_t>(h->get<std::string>(), kHashKey);
    } catch (const std::exception& e) {
      fail(what + " is corrupt: " + e.what());
    }
    if (manifest_hash(j) != recorded) fail(what + " is corrupt: its hash differs from the " + kHashKey + " it records");
  }
  Manifest m;
  try {
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion)
      fail("format version " + std::to_string(m.format_version) + ", this build reads " +
           std::to_string(kOldestFormatVersion) + " to " + std::to_string(kFormatVersion));
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.dp_size = j.at("dp_size").get<int>();
    m.stage = j.at("stage").get<int>();
    m.dtype = j.at("dtype").get<std::string>();
    m.kinds = j.at("kinds").get<std::vector<std::string>>();
    m.config = j.at("config");
    m.engine_state = j.at("engine_state");
    m.client_state = j.value("client_state", json::object());
    for (const auto& p : j.at("params")) {
      ParamRecord r;
      r.name = p.at("name").get<std::string>();
      r.shape = p.at("shape").get<std::vector<int64_t>>();
      r.numel = p.at("numel").get<int64_t>();
      for (const auto& f : p.at("fragments")) {
        if (!f.is_array() || f.size() != 3) fail("param '" + r.name + "': a fragment is not [rank, begin, end]");
        r.fragments.push_back({f.at(0).get<int>(), f.at(1).get<int64_t>(), f.at(2).get<int64_t>()});
      }
      m.params.push_back(std::move(r));
    }
    for (const auto& r : j.value("replicated", json::array()))  // absent in older manifests
      m.replicated.push_back({r.at("name").get<std::string>(), r.at("kind").get<std::string>(),
                              r.at("dtype").get<std::string>(), r.at("shape").get<std::vector<int64_t>>()});
    for (const auto& [r, f] : j.at("files").items())
      m.files[parse_decimal<int>(r, "files: rank")] = {f.at("file").get<std::string>(), f.at("bytes").get<int64_t>(),
                                                        parse_decimal<uint64_t>(f.at("hash").get<std::string>(),
                                                                                "files: " + r + ": hash")};
  } catch (const std::exception& e) {
    fail(what + " is not readable: " + e.what());
  }
  if (!h && m.format_version >= 2)
    fail(what + " is corrupt: it has no " + kHashKey + " (format version " + std::to_string(m.format_version) +
         " always records one)");
  try {
    validate(m);
  } catch (const std::exception& e) {
    fail(what + " is invalid: " + e.what());
  }
  return m;
}

}  // namespace zero::ckpt

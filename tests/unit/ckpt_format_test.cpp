// The checkpoint format without torch or ranks: safetensors round trip,
// truncation and corruption detection, the streaming hash, reading any
// element range across fragments, the manifest's hash and validation, and
// the publish/latest protocol.
#include <stdexcept>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "common/half_bits.h"

namespace {

namespace fs = std::filesystem;
using namespace zero::ckpt;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("zero-ckpt-unit-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

TEST(Safetensors, RoundTripAndHash) {
  TempDir d;
  std::vector<float> a(1001);
  std::iota(a.begin(), a.end(), 0.5f);
  std::vector<int64_t> b = {7, -3};
  SafetensorsWriter w;
  w.add("a", "F32", {7, 143}, a.data());
  w.add("b", "I64", {2}, b.data());
  w.set_metadata("format", "pt");
  const auto digest = w.write(d / "x.safetensors");

  SafetensorsFile f(d / "x.safetensors");
  EXPECT_EQ(f.file_bytes(), digest.bytes);
  EXPECT_EQ(f.hash(), digest.hash);  // the writer's streaming hash equals the one-shot hash of the file
  EXPECT_EQ(f.entry("a").shape, (std::vector<int64_t>{7, 143}));
  EXPECT_EQ(std::memcmp(f.data("a"), a.data(), a.size() * 4), 0);
  EXPECT_EQ(reinterpret_cast<const int64_t*>(f.data("b"))[1], -3);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data("a")) % 8, 0u);  // data section 8-byte aligned
}

TEST(Safetensors, TruncationAndCorruptionAreNamed) {
  TempDir d;
  std::vector<float> a(100, 1.0f);
  SafetensorsWriter w;
  w.add("a", "F32", {100}, a.data());
  const auto digest = w.write(d / "x.safetensors");
  fs::resize_file(d / "x.safetensors", digest.bytes - 4);
  try {
    SafetensorsFile f(d / "x.safetensors");
    FAIL() << "opened a truncated file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("x.safetensors is truncated or corrupt"), std::string::npos) << e.what();
  }
  fs::resize_file(d / "x.safetensors", 5);
  EXPECT_THROW(SafetensorsFile(d / "x.safetensors"), std::runtime_error);
}

TEST(Hash, StreamingEqualsOneShotAndSeesEveryByte) {
  std::vector<unsigned char> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 31);
  const uint64_t h = hash64(buf.data(), 1000);
  EXPECT_NE(h, hash64(buf.data(), 999));  // length matters
  buf[997] ^= 1;
  EXPECT_NE(h, hash64(buf.data(), 1000));  // a flipped bit in the tail matters
}

// A checkpoint of one param w (shape [2, 5]) whose fragments [0, 4) and
// [4, 10) lie in two "ranks'" files; values 0..9. Returns the manifest.
Manifest write_two_rank_checkpoint(const TempDir& d) {
  const std::string tag_dir = d / "t";
  fs::create_directories(tag_dir);
  std::vector<float> full(10);
  std::iota(full.begin(), full.end(), 0.0f);
  Manifest m;
  m.tag = "t";
  m.world_size = 2;
  m.dp_size = 2;
  m.dtype = "float";
  m.kinds = {"master"};
  m.config = nlohmann::json::object();
  m.engine_state = nlohmann::json::object();
  m.params.push_back({"w", {2, 5}, 10, {{0, 0, 4}, {1, 4, 10}}});
  for (int r = 0; r < 2; ++r) {
    SafetensorsWriter w;
    const int64_t begin = r == 0 ? 0 : 4, end = r == 0 ? 4 : 10;
    w.add(tensor_name("w", "master"), "F32", {end - begin}, full.data() + begin);
    const auto dg = w.write(tag_dir + "/" + rank_file_name(r));
    m.files[r] = {rank_file_name(r), dg.bytes, dg.hash};
  }
  std::ofstream(tag_dir + "/manifest.json") << m.to_json().dump(1);
  std::ofstream(d / "latest") << "t\n";
  return m;
}

// Expects `fn` to throw std::runtime_error whose message has every part.
template <typename F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning '" << *parts.begin() << "'";
  } catch (const std::runtime_error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

// Two "ranks" hold fragments of one param; any range reads back whole.
TEST(CheckpointReader, ReadsAnyRangeAcrossFragments) {
  TempDir d;
  write_two_rank_checkpoint(d);
  std::vector<float> full(10);
  std::iota(full.begin(), full.end(), 0.0f);

  CheckpointReader reader(d.path.string(), "");
  std::vector<float> got(7, -1.0f);
  reader.read("w", "master", 2, 9, got.data());  // spans both files
  EXPECT_EQ(got, std::vector<float>(full.begin() + 2, full.begin() + 9));
  EXPECT_THROW(reader.read("nope", "master", 0, 1, got.data()), std::runtime_error);

  consolidate(d.path.string(), "", d / "w.safetensors", "bf16");
  SafetensorsFile c(d / "w.safetensors");
  EXPECT_EQ(c.entry("w").dtype, "BF16");
  EXPECT_EQ(zero::bits::from_bf16(reinterpret_cast<const uint16_t*>(c.data("w"))[9]), 9.0f);
}

// ---- the manifest: its hash and its consistency ------------------------------

const std::string kWhere = "/ckpt/t/manifest.json";

// The JSON of a valid manifest (the one above, without files on disk).
nlohmann::json good_manifest() {
  Manifest m;
  m.tag = "t";
  m.world_size = 2;
  m.dp_size = 2;
  m.stage = 3;
  m.dtype = "float";
  m.kinds = {"master"};
  m.config = {{"train_batch_size", 8}, {"optimizer", {{"params", {{"lr", 1e-3}}}}}};
  m.engine_state = {{"global_steps", 4}};
  m.params.push_back({"w", {2, 5}, 10, {{0, 0, 4}, {1, 4, 10}}});
  m.params.push_back({"b", {5}, 5, {{1, 0, 5}}});
  m.replicated.push_back({"running_mean", "buffer", "F32", {5}});
  m.files[0] = {rank_file_name(0), 100, 7};
  m.files[1] = {rank_file_name(1), 200, 9};
  return m.to_json();
}

// Edits a manifest's JSON and records the matching hash, as a writer with
// that bug would: the validation, not the hash, must catch it.
nlohmann::json edited(const std::function<void(nlohmann::json&)>& edit) {
  auto j = good_manifest();
  edit(j);
  j["manifest_hash"] = std::to_string(manifest_hash(j));
  return j;
}

void expect_invalid(const std::function<void(nlohmann::json&)>& edit, const std::string& problem) {
  const auto j = edited(edit);
  expect_error([&] { Manifest::from_json(j, kWhere); }, {"checkpoint manifest " + kWhere + " is invalid", problem});
}

nlohmann::json frag(int rank, int64_t begin, int64_t end) { return nlohmann::json::array({rank, begin, end}); }

TEST(Manifest, RoundTrips) {
  const auto j = good_manifest();
  EXPECT_TRUE(j.contains("manifest_hash"));
  const auto text = j.dump(1);  // as the engine writes it: indented
  const Manifest m = Manifest::from_json(nlohmann::json::parse(text), kWhere);
  EXPECT_EQ(m.format_version, kFormatVersion);
  ASSERT_EQ(m.params.size(), 2u);
  EXPECT_EQ(m.params[0].fragments[1].end, 10);
  EXPECT_EQ(m.files.at(1).hash, 9u);
  EXPECT_EQ(m.to_json(), j);
}

TEST(Manifest, NumelMustBeTheProductOfTheShape) {
  expect_invalid([](auto& j) { j["params"][0]["numel"] = 12; },
                 "param 'w': numel 12 differs from the product of shape [2, 5] (10)");
  // Negative dims whose product is numel.
  expect_invalid([](auto& j) { j["params"][0]["shape"] = {-2, -5}; }, "param 'w': shape [-2, -5] has a negative dimension");
  expect_invalid([](auto& j) { j["params"][0]["shape"] = {int64_t{1} << 32, int64_t{1} << 32}; },
                 "param 'w': the product of shape [4294967296, 4294967296] overflows int64");
  expect_invalid([](auto& j) { j["params"][1]["numel"] = -5; }, "param 'b': numel -5 is negative");
}

TEST(Manifest, FragmentsMustTileEachParamExactlyOnce) {
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(1, 5, 10)}; },
                 "param 'w': no fragment covers elements [4, 5)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(1, 4, 9)}; },
                 "param 'w': no fragment covers elements [9, 10)");
  expect_invalid([](auto& j) { j["params"][1]["fragments"] = nlohmann::json::array(); },
                 "param 'b': no fragment covers elements [0, 5)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(1, 4, 10), frag(0, 0, 5)}; },
                 "param 'w': fragments overlap on elements [4, 5)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(1, 4, 11)}; },
                 "param 'w': fragment [4, 11) of rank 1 is outside the param's range [0, 10)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, -1, 4), frag(1, 4, 10)}; },
                 "param 'w': fragment [-1, 4) of rank 0 is outside the param's range [0, 10)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(1, 4, 4), frag(1, 4, 10)}; },
                 "param 'w': fragment [4, 4) of rank 1 is empty or reversed (begin >= end)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(1, 10, 4)}; },
                 "param 'w': fragment [10, 4) of rank 1 is empty or reversed");
}

TEST(Manifest, RanksMustExistAndHaveFiles) {
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(0, 0, 4), frag(2, 4, 10)}; },
                 "param 'w': fragment [4, 10) of rank 2 names a rank outside [0, world_size 2)");
  expect_invalid([](auto& j) { j["params"][0]["fragments"] = {frag(-1, 0, 4), frag(1, 4, 10)}; },
                 "names a rank outside [0, world_size 2)");
  expect_invalid([](auto& j) { j["files"].erase("1"); },
                 "param 'w': fragment [4, 10) of rank 1 is in a file the manifest does not list");
  expect_invalid([](auto& j) { j["files"]["7"] = j["files"]["1"]; }, "files: rank 7 is outside [0, world_size 2)");
  expect_invalid([](auto& j) { j["files"]["1"]["bytes"] = -200; }, "files: rank 1: size -200 is negative");
  expect_invalid([](auto& j) { j["files"]["1"]["file"] = "../../x.safetensors"; },
                 "'../../x.safetensors' is not a file name inside the checkpoint directory");
  expect_invalid([](auto& j) { j["params"][1]["name"] = "w"; }, "param 'w' is listed twice");
}

TEST(Manifest, FrozenParamsAndBuffersAreChecked) {
  expect_invalid([](auto& j) { j["replicated"][0]["name"] = "b"; },
                 "frozen param or buffer 'b': the name is listed twice");
  expect_invalid([](auto& j) { j["replicated"][0]["kind"] = "weight"; }, "kind 'weight' is neither param nor buffer");
  expect_invalid([](auto& j) { j["replicated"][0]["dtype"] = "F31"; }, "dtype 'F31' is not a safetensors dtype");
  expect_invalid([](auto& j) { j["replicated"][0]["shape"] = {-1, -5}; }, "shape [-1, -5] has a negative dimension");
  expect_invalid([](auto& j) { j["replicated"][0]["shape"] = {int64_t{1} << 31, int64_t{1} << 31}; },
                 "the byte size of shape [2147483648, 2147483648] overflows int64");
  expect_invalid(
      [](auto& j) {
        j["params"][0]["fragments"] = {frag(1, 0, 4), frag(1, 4, 10)};
        j["files"].erase("0");
      },
      "frozen param or buffer 'running_mean': it is in rank 0's file, which the manifest does not list");
}

TEST(Manifest, AFlippedByteFailsTheHash) {
  TempDir d;
  write_two_rank_checkpoint(d);
  const std::string path = d / "t/manifest.json";
  EXPECT_NO_THROW(CheckpointReader(d.path.string(), ""));
  std::string text;
  {
    std::ifstream f(path);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t at = text.find("\"float\"");
  ASSERT_NE(at, std::string::npos);
  text[at + 1] ^= 1;  // "float" -> "gloat": still valid JSON, still a plausible manifest
  std::ofstream(path, std::ios::trunc) << text;
  expect_error([&] { CheckpointReader(d.path.string(), ""); },
               {"checkpoint manifest " + path + " is corrupt: its hash differs"});
  expect_error([&] { consolidate(d.path.string(), "", d / "w.safetensors", "fp32"); }, {"is corrupt"});
}

// Sections a later writer adds (e.g. frozen params, buffers) are covered
// without this reader knowing them.
TEST(Manifest, TheHashCoversSectionsThisReaderDoesNotKnow) {
  auto j = edited([](auto& j) { j["buffers"] = {{"running_mean", {1.0, 2.0}}}; });
  EXPECT_NO_THROW(Manifest::from_json(j, kWhere));
  j["buffers"]["running_mean"][1] = 3.0;
  expect_error([&] { Manifest::from_json(j, kWhere); }, {"is corrupt: its hash differs"});
}

TEST(Manifest, Version2NeedsItsHashVersion1LoadsWithout) {
  auto j = good_manifest();
  j.erase("manifest_hash");
  expect_error([&] { Manifest::from_json(j, kWhere); }, {kWhere + " is corrupt: it has no manifest_hash"});
  j["format_version"] = 1;  // written before the hash existed
  EXPECT_NO_THROW(Manifest::from_json(j, kWhere));
  j["params"][0]["numel"] = 12;  // old manifests are validated all the same
  expect_error([&] { Manifest::from_json(j, kWhere); }, {"numel 12 differs"});
  j["format_version"] = kFormatVersion + 1;
  expect_error([&] { Manifest::from_json(j, kWhere); }, {"format version 3, this build reads 1 to 2"});
}

TEST(Manifest, TheWriterRefusesAnInvalidManifest) {
  Manifest m;
  m.tag = "t";
  m.params.push_back({"w", {2, 5}, 12, {{0, 0, 12}}});
  m.files[0] = {rank_file_name(0), 0, 0};
  expect_error([&] { m.to_json(); }, {"manifest of tag t is invalid", "numel 12 differs"});
}

// What zero-ckpt consolidate runs: a manifest whose numel exceeds its shape
// used to copy heap memory past the buffer into the output and succeed.
TEST(Manifest, ConsolidateRejectsNumelThatDisagreesWithTheShape) {
  TempDir d;
  write_two_rank_checkpoint(d);
  const std::string path = d / "t/manifest.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  j["params"][0]["shape"] = {4, 5};
  j["manifest_hash"] = std::to_string(manifest_hash(j));
  std::ofstream(path, std::ios::trunc) << j.dump();
  expect_error([&] { consolidate(d.path.string(), "", d / "w.safetensors", "fp32"); },
               {path + " is invalid", "param 'w': numel 10 differs from the product of shape [4, 5] (20)"});
  EXPECT_FALSE(fs::exists(d / "w.safetensors"));
}

TEST(Publish, LatestMovesOnlyWhenASaveIsComplete) {
  TempDir d;
  const std::string dir = d.path.string();
  EXPECT_THROW(resolve_tag(dir, ""), std::runtime_error);  // nothing saved yet
  for (const char* tag : {"a", "b"}) {
    fs::create_directories(partial_dir(dir, tag));
    std::ofstream(partial_dir(dir, tag) + "/manifest.json") << "{}";
    publish(dir, tag);
    EXPECT_EQ(resolve_tag(dir, ""), tag);
    EXPECT_FALSE(fs::exists(partial_dir(dir, tag)));
  }
  fs::create_directories(partial_dir(dir, "c"));  // a save that died
  EXPECT_EQ(resolve_tag(dir, ""), "b");
  // Re-saving a tag replaces it.
  fs::create_directories(partial_dir(dir, "b"));
  std::ofstream(partial_dir(dir, "b") + "/marker") << "new";
  publish(dir, "b");
  EXPECT_TRUE(fs::exists(d / "b/marker"));
}

}  // namespace

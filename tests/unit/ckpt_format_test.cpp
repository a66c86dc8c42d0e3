// The checkpoint format without torch or ranks: safetensors round trip,
// truncation and corruption detection, the streaming hash, reading any
// element range across fragments, and the publish/latest protocol.
#include <unistd.h>

#include <cstring>
#include <filesystem>
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

// Two "ranks" hold fragments of one param; any range reads back whole.
TEST(CheckpointReader, ReadsAnyRangeAcrossFragments) {
  TempDir d;
  const std::string tag_dir = d / "t";
  fs::create_directories(tag_dir);
  std::vector<float> full(10);
  std::iota(full.begin(), full.end(), 0.0f);
  Manifest m;
  m.tag = "t";
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
  std::ofstream(tag_dir + "/manifest.json") << m.to_json().dump();
  std::ofstream(d / "latest") << "t\n";

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

// zero-ckpt: inspect and convert zero-cpp checkpoints (no torch, no ranks).
//
//   zero-ckpt info DIR [--tag TAG]
//   zero-ckpt consolidate DIR OUT.safetensors [--tag TAG] [--dtype fp32|bf16]
//
// info prints what a checkpoint holds (world size, stage, dtype, steps,
// params) and checks every file against the manifest. consolidate writes the
// full weights by param name, readable by any safetensors reader and by
// zero-train --init-from.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt/checkpoint_dir.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-ckpt info DIR [--tag TAG]\n"
    "       zero-ckpt consolidate DIR OUT.safetensors [--tag TAG] [--dtype fp32|bf16]\n";

// Errors: stderr, exit 2. --help: stdout, exit 0 (it was asked for).
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "zero-ckpt: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("%s"
              "Inspects and converts zero-cpp checkpoints (no ranks needed).\n"
              "  info          what a checkpoint holds; checks every file's size and hash\n"
              "  consolidate   the full weights by param name in one safetensors file\n"
              "  --tag TAG     that tag instead of the one DIR/latest names\n"
              "  --dtype       fp32 (default) or bf16 for consolidate\n"
              "  -h, --help    this text\n",
              kUsage);
  std::exit(0);
}

int info(const std::string& dir, const std::string& tag) {
  zero::ckpt::CheckpointReader r(dir, tag);
  const auto& m = r.manifest();
  int64_t numel = 0;
  for (const auto& p : m.params) numel += p.numel;
  std::printf("checkpoint %s\n  saved by %d ranks, ZeRO stage %d, params %s, state: ", r.path().c_str(), m.world_size,
              m.stage, m.dtype.c_str());
  for (size_t i = 0; i < m.kinds.size(); ++i) std::printf("%s%s", i ? ", " : "", m.kinds[i].c_str());
  std::printf("\n  steps: %s\n", m.engine_state.dump().c_str());
  if (!m.client_state.empty()) std::printf("  client state: %s\n", m.client_state.dump().c_str());
  std::printf("  %zu params, %lld elements\n", m.params.size(), static_cast<long long>(numel));
  // Reading one element of each kind from every fragment opens (and so
  // checks the size and hash of) every file.
  float x;
  for (const auto& p : m.params)
    for (const auto& kind : m.kinds)
      for (const auto& f : p.fragments) r.read(p.name, kind, f.begin, f.begin + 1, &x);
  for (const auto& [rank, f] : m.files)
    std::printf("  %s: %lld bytes, hash ok\n", f.file.c_str(), static_cast<long long>(f.bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") help();
  if (argc < 3) usage("a command and a directory are required");
  const std::string cmd = argv[1], dir = argv[2];
  std::string tag, dtype = "fp32", out;
  int i = 3;
  if (cmd == "consolidate") {
    if (argc < 4) usage("consolidate needs an output file");
    out = argv[i++];
  } else if (cmd != "info") {
    usage("unknown command " + cmd);
  }
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tag" && i + 1 < argc) tag = argv[++i];
    else if (a == "--dtype" && i + 1 < argc) dtype = argv[++i];
    else usage("unknown option " + a);
  }
  try {
    if (cmd == "info") return info(dir, tag);
    zero::ckpt::consolidate(dir, tag, out, dtype);
    std::printf("wrote %s (%s)\n", out.c_str(), dtype.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-ckpt: %s\n", e.what());
    return 1;
  }
}

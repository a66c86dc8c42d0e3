// ds_io: sequential read and write GB/s of zero-cpp's direct I/O engine
// (src/io/aio_engine.h) against fio on the same file, in the same run, as
// DeepSpeed's ds_io does for its aio library (issue 31: goal >= 90% of
// fio's best).
//
//   ds_io [--dir DIR] [--bytes N] [--block-sizes 128K,1M,8M] [--queue-depths 1,4,8,32]
//         [--threads 1,2] [--repeat R] [--single-submit] [--no-overlap-events]
//         [--buffer huge|plain] [--fio PATH | --no-fio]
//
// One file of N bytes (default 1 GiB) under DIR (default /tmp) is laid out
// once, then for each direction, block size and queue depth: our engine
// moves the whole file as one request (as DeepSpeed's handle does) at each
// thread count, alternating with fio (ioengine=io_uring, direct=1, the same bs and
// iodepth, numjobs = each thread count, each job its contiguous share) moves
// the same bytes of the same file. Each figure is the best of R runs
// (default 3), ours and fio's interleaved. The
// JSON on stdout gives every config's GB/s (1e9 bytes/s), each side's best
// per direction and ours/fio's, and config by config (threads = numjobs)
// the median ratio and how many reach 0.9. Progress goes to stderr. Our buffer is
// an AlignedBuffer (from 2 MiB: transparent huge pages, as the swappers'
// buffers are); --buffer plain gives it 4 KiB pages (MADV_NOHUGEPAGE), as
// fio's own buffers have. Without fio (not
// installed, or --no-fio) our figures alone are given, with a note.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/aio_engine.h"

namespace {

using zero::io::AioConfig;
using zero::io::AioEngine;
using zero::io::AlignedBuffer;
using zero::io::DirectFile;
using json = nlohmann::json;

int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit(end);
  int64_t mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mult = int64_t{1} << 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") mult = int64_t{1} << 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") mult = int64_t{1} << 30;
  else if (!unit.empty()) throw std::invalid_argument("bad size: " + s);
  return static_cast<int64_t>(v * static_cast<double>(mult));
}

std::vector<int64_t> parse_list(const std::string& s, bool sizes) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(sizes ? parse_size(item) : std::stoll(item));
  return out;
}

std::string size_name(int64_t b) {
  if (b % (int64_t{1} << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b % 1024 == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs a command, returning its stdout (empty with ok=false when it fails).
std::string capture(const std::string& cmd, bool& ok) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ok = false;
    return out;
  }
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

struct Options {
  std::string dir = "/tmp";
  int64_t bytes = int64_t{1} << 30;
  std::vector<int64_t> block_sizes = {128 << 10, 1 << 20, 8 << 20};
  std::vector<int64_t> queue_depths = {1, 4, 8, 32};
  std::vector<int64_t> threads = {1, 2};
  int repeat = 3;
  bool single_submit = false;
  bool overlap_events = true;
  bool huge_buffer = true;
  std::string fio = "fio";
  bool use_fio = true;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir") o.dir = next();
    else if (a == "--bytes") o.bytes = parse_size(next());
    else if (a == "--block-sizes") o.block_sizes = parse_list(next(), true);
    else if (a == "--queue-depths") o.queue_depths = parse_list(next(), false);
    else if (a == "--threads") o.threads = parse_list(next(), false);
    else if (a == "--repeat") o.repeat = std::max(1, std::stoi(next()));
    else if (a == "--single-submit") o.single_submit = true;
    else if (a == "--no-overlap-events") o.overlap_events = false;
    else if (a == "--buffer") {
      const std::string b = next();
      if (b != "huge" && b != "plain") throw std::invalid_argument("--buffer is huge or plain, not " + b);
      o.huge_buffer = b == "huge";
    }
    else if (a == "--fio") o.fio = next();
    else if (a == "--no-fio") o.use_fio = false;
    else {
      std::cerr << "usage: ds_io [--dir DIR] [--bytes N] [--block-sizes 128K,1M,8M] [--queue-depths 1,4,8,32]\n"
                   "             [--threads 1,2] [--repeat R] [--single-submit] [--no-overlap-events]\n"
                   "             [--buffer huge|plain] [--fio PATH | --no-fio]\n";
      return 2;
    }
  }
  if (o.bytes <= 0 || o.bytes % zero::io::kAlignment != 0) {
    std::cerr << "ds_io: --bytes " << o.bytes << " must be a positive multiple of 4096\n";
    return 2;
  }

  json result;
  result["bytes"] = o.bytes;
  result["dir"] = o.dir;
  result["repeat"] = o.repeat;
  result["single_submit"] = o.single_submit;
  result["overlap_events"] = o.overlap_events;
  result["buffer"] = o.huge_buffer ? "huge" : "plain";
  std::string fio_version;
  if (o.use_fio) {
    bool ok = false;
    fio_version = capture(o.fio + " --version 2>/dev/null", ok);
    while (!fio_version.empty() && (fio_version.back() == '\n' || fio_version.back() == '\r')) fio_version.pop_back();
    if (!ok || fio_version.empty()) {
      std::cerr << "ds_io: fio (" << o.fio << ") is not installed or does not run: only our engine is measured "
                << "(apt-get install fio, or ./run bench, which installs it)\n";
      result["fio_note"] = "fio not found (" + o.fio + "): skipped";
      o.use_fio = false;
    }
  }
  if (o.use_fio) result["fio_version"] = fio_version;

  const std::string path = o.dir + "/ds_io." + std::to_string(::getpid()) + ".dat";
  try {
    DirectFile file(path, true);
    file.reserve(o.bytes);
    AlignedBuffer aligned;
    std::unique_ptr<void, decltype(&std::free)> plain(nullptr, &std::free);
    void* data = nullptr;
    if (o.huge_buffer) {
      aligned = AlignedBuffer(o.bytes);
      data = aligned.data();
    } else {
      if (posix_memalign(&data, 4096, static_cast<size_t>(o.bytes)) != 0) throw std::bad_alloc();
      plain.reset(data);
      ::madvise(data, static_cast<size_t>(o.bytes), MADV_NOHUGEPAGE);
    }
    // The buffer's pages are touched and the file written once, so no run
    // pays for page faults or for allocating the file's blocks.
    auto* p = static_cast<unsigned char*>(data);
    for (int64_t i = 0; i < o.bytes; i += 4096) p[i] = static_cast<unsigned char>(i >> 12);
    {
      AioEngine layout(AioConfig{});
      layout.wait(layout.write(file, data, o.bytes, 0));
    }

    json configs = json::array();
    struct Best {
      double gbps = 0;
      json config;
    };
    Best best[2][2];  // [direction][0 ours, 1 fio]
    const char* names[2] = {"read", "write"};
    for (int d = 0; d < 2; ++d) {
      const bool is_read = d == 0;
      for (int64_t bs : o.block_sizes) {
        for (int64_t qd : o.queue_depths) {
          // Ours and fio's runs of this block size and depth alternate, so
          // both see the same state of a shared machine; best of R each.
          std::vector<double> zero_gbps(o.threads.size(), 0.0), fio_gbps(o.threads.size(), 0.0);
          std::vector<std::string> fio_cmd(o.threads.size());
          std::vector<bool> fio_ok(o.threads.size(), o.use_fio);
          for (size_t k = 0; k < o.threads.size(); ++k) {
            const int64_t t = o.threads[k];
            const int64_t share = o.bytes / t;
            if (o.bytes % (t * 4096) != 0) fio_ok[k] = false;
            std::ostringstream cmd;
            cmd << o.fio << " --name=ds_io --filename=" << path << " --rw=" << names[d] << " --bs=" << bs
                << " --iodepth=" << qd << " --ioengine=io_uring --direct=1 --numjobs=" << t << " --size=" << share
                << " --offset_increment=" << share << " --group_reporting --output-format=json 2>/dev/null";
            fio_cmd[k] = cmd.str();
          }
          for (int r = 0; r < o.repeat; ++r) {
            for (size_t k = 0; k < o.threads.size(); ++k) {
              AioConfig c;
              c.block_size = bs;
              c.queue_depth = static_cast<int>(qd);
              c.thread_count = static_cast<int>(o.threads[k]);
              c.single_submit = o.single_submit;
              c.overlap_events = o.overlap_events;
              AioEngine engine(c);
              const auto t0 = std::chrono::steady_clock::now();
              const auto ticket = is_read ? engine.read(file, data, o.bytes, 0)
                                          : engine.write(file, data, o.bytes, 0);
              engine.wait(ticket);
              zero_gbps[k] = std::max(zero_gbps[k], static_cast<double>(o.bytes) / seconds_since(t0) / 1e9);
            }
            for (size_t k = 0; k < o.threads.size(); ++k) {
              if (!fio_ok[k]) continue;
              bool ok = false;
              const std::string out = capture(fio_cmd[k], ok);
              const auto brace = out.find('{');
              if (!ok || brace == std::string::npos) {
                std::cerr << "ds_io: fio failed: " << fio_cmd[k] << "\n";
                result["fio_note"] = "fio failed for some configs: " + fio_cmd[k];
                fio_ok[k] = false;
                continue;
              }
              const json j = json::parse(out.substr(brace));
              const double bw = j.at("jobs").at(0).at(names[d]).at("bw_bytes").get<double>();
              fio_gbps[k] = std::max(fio_gbps[k], bw / 1e9);
            }
          }
          for (size_t k = 0; k < o.threads.size(); ++k) {
            const int64_t t = o.threads[k];
            json entry = {{"direction", names[d]}, {"engine", "zero"}, {"block_size", bs},
                          {"queue_depth", qd},     {"threads", t},     {"GBps", zero_gbps[k]}};
            std::cerr << "ds_io: " << names[d] << " zero bs " << size_name(bs) << " qd " << qd << " threads " << t
                      << ": " << zero_gbps[k] << " GB/s\n";
            if (zero_gbps[k] > best[d][0].gbps) best[d][0] = {zero_gbps[k], entry};
            configs.push_back(entry);
          }
          for (size_t k = 0; k < o.threads.size(); ++k) {
            if (!fio_ok[k]) continue;
            const int64_t t = o.threads[k];
            json entry = {{"direction", names[d]}, {"engine", "fio"}, {"block_size", bs},
                          {"queue_depth", qd},     {"numjobs", t},    {"GBps", fio_gbps[k]}};
            std::cerr << "ds_io: " << names[d] << " fio  bs " << size_name(bs) << " qd " << qd << " jobs " << t
                      << ": " << fio_gbps[k] << " GB/s\n";
            if (fio_gbps[k] > best[d][1].gbps) best[d][1] = {fio_gbps[k], entry};
            configs.push_back(entry);
          }
        }
      }
    }
    result["configs"] = configs;
    for (int d = 0; d < 2; ++d) {
      json s = {{"zero_best_GBps", best[d][0].gbps}, {"zero_best", best[d][0].config}};
      if (best[d][1].gbps > 0) {
        s["fio_best_GBps"] = best[d][1].gbps;
        s["fio_best"] = best[d][1].config;
        s["zero_over_fio"] = best[d][0].gbps / best[d][1].gbps;
        // Config by config (same block size and depth, threads = numjobs):
        // less at the mercy of one lucky run than the ratio of the bests.
        std::vector<double> ratios;
        for (const auto& z : configs) {
          if (z["direction"] != names[d] || z["engine"] != "zero") continue;
          for (const auto& f : configs) {
            if (f["direction"] == names[d] && f["engine"] == "fio" && f["block_size"] == z["block_size"] &&
                f["queue_depth"] == z["queue_depth"] && f["numjobs"] == z["threads"] && f["GBps"] > 0) {
              ratios.push_back(z["GBps"].get<double>() / f["GBps"].get<double>());
            }
          }
        }
        if (!ratios.empty()) {
          std::sort(ratios.begin(), ratios.end());
          const size_t n = ratios.size();
          s["per_config_zero_over_fio_median"] = n % 2 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
          s["per_config_at_least_0.9"] =
              std::to_string(std::count_if(ratios.begin(), ratios.end(), [](double r) { return r >= 0.9; })) + "/" +
              std::to_string(n);
        }
      }
      result["summary"][names[d]] = s;
    }
  } catch (const std::exception& e) {
    std::cerr << "ds_io: " << e.what() << "\n";
    return 1;
  }
  std::cout << result.dump(2) << "\n";
  return 0;
}

// zero-train: trains the bundled GPT on a text file with a DeepSpeed
// ds_config, on however many ranks it is launched with.
//
//   zero-run -n 2 -- zero-train --config ds_config.json [--data FILE] [--steps N]
//       [--layers L --d-model D --heads H --seq S] [--untied-head] [--seed S]
//       [--log-json FILE | --log-json-all FILE] [--backward-chunks K [--coalesce]]
//       [--save DIR [--save-every K]] [--resume DIR [--tag TAG]] [--init-from WEIGHTS.safetensors]
//       [--device cpu|cuda]
//
// --save writes a checkpoint to DIR every K steps (default: at the end);
// --resume continues from DIR's latest checkpoint (or tag TAG, e.g. step200)
// up to --steps in total;
// --init-from starts from consolidated weights (zero-ckpt consolidate).
//
// --backward-chunks K runs K forward/backward passes per micro-batch (as
// GradCache-style losses do); --coalesce wraps them in
// engine.coalesce_grad_reduction(), so they cost one reduction, not K.
//
// Progress goes to stderr (rank 0): one line per report (steps_per_print;
// and the first and last step), then a summary. --log-json writes JSON Lines on rank 0
// (--log-json-all: every rank, as FILE.rankN): a "setup" record, then one
// "step" record per optimizer step. Their field names are stable.
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "memory/cpu_allocator.h"
#include "memory/page_buffer.h"
#include "memory/shared_arena.h"
#include "memory/device_memory.h"
#include "train/gpt_trainer.h"
#include "train/progress_timer.h"

namespace {

using nlohmann::json;

struct Args {
  std::string config;
  std::string data = zero::data::ByteCorpus::default_path();
  zero::models::GPTConfig model;
  int64_t steps = 100;
  uint64_t seed = 1234;
  std::string log_json;
  bool log_all = false;
  int64_t backward_chunks = 1;
  bool coalesce = false;
  std::string device = "cpu";
  std::string save_dir, resume_dir, resume_tag, init_from;
  int64_t save_every = 0;  // 0: only at the end
};

constexpr const char* kUsage =
    "usage: zero-train --config FILE [--data FILE_OR_DIR] [--steps N] [--seed S]\n"
    "                  [--layers L] [--d-model D] [--heads H] [--seq S] [--untied-head] [--checkpoint-activations]\n"
    "                  [--log-json FILE | --log-json-all FILE] [--backward-chunks K [--coalesce]]\n"
    "                  [--save DIR [--save-every K]] [--resume DIR [--tag TAG]] [--init-from FILE]\n"
    "                  [--device cpu|cuda]\n";

// Errors: stderr, exit 2. --help: stdout, exit 0 (it was asked for).
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "zero-train: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("%s"
              "Trains the bundled GPT (byte tokens) with a DeepSpeed ds_config on the ranks it is\n"
              "launched with (zero-run -n N -- zero-train ...).\n"
              "  --config FILE          the ds_config (required)\n"
              "  --data FILE_OR_DIR     text to train on (default: %s)\n"
              "  --steps N              optimizer steps in total (default 100)\n"
              "  --seed S               weights and data order (default 1234)\n"
              "  --layers, --d-model, --heads, --seq, --untied-head   the model's shape\n"
              "  --checkpoint-activations   recompute each block's activations in backward\n"
              "  --log-json FILE        JSON Lines log on rank 0 (--log-json-all: every rank, FILE.rankN)\n"
              "  --backward-chunks K    K backward passes per micro-batch (--coalesce: one reduction)\n"
              "  --save DIR             checkpoint into DIR at the end (--save-every K: every K steps)\n"
              "  --resume DIR           continue from DIR's latest checkpoint (--tag TAG: that tag)\n"
              "  --init-from FILE       start from consolidated weights (zero-ckpt consolidate)\n"
              "  --device cpu|cuda      where the model trains (cuda: GPU LOCAL_RANK mod the GPUs visible)\n"
              "  -h, --help             this text\n",
              kUsage, zero::data::ByteCorpus::default_path().c_str());
  std::exit(0);
}

int64_t to_int(const std::string& flag, const char* v, int64_t min) {
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end || x < min) usage(flag + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--config") a.config = val();
    else if (f == "--data") a.data = val();
    else if (f == "--steps") a.steps = to_int(f, val(), 0);
    else if (f == "--seed") a.seed = static_cast<uint64_t>(to_int(f, val(), 0));
    else if (f == "--layers") a.model.n_layer = to_int(f, val(), 1);
    else if (f == "--d-model") a.model.d_model = to_int(f, val(), 1);
    else if (f == "--heads") a.model.n_head = to_int(f, val(), 1);
    else if (f == "--seq") a.model.seq_len = to_int(f, val(), 1);
    else if (f == "--untied-head") a.model.tied_head = false;
    else if (f == "--checkpoint-activations") a.model.checkpoint_activations = true;
    else if (f == "--log-json") a.log_json = val();
    else if (f == "--log-json-all") a.log_json = val(), a.log_all = true;
    else if (f == "--backward-chunks") a.backward_chunks = to_int(f, val(), 1);
    else if (f == "--coalesce") a.coalesce = true;
    else if (f == "--save") a.save_dir = val();
    else if (f == "--save-every") a.save_every = to_int(f, val(), 1);
    else if (f == "--resume") a.resume_dir = val();
    else if (f == "--tag") a.resume_tag = val();
    else if (f == "--init-from") a.init_from = val();
    else if (f == "--device") a.device = val();
    else if (f == "-h" || f == "--help") help();
    else usage("unknown option " + f);
  }
  if (a.config.empty()) usage("--config is required");
  if (a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda, not '" + a.device + "'");
  if (a.save_every && a.save_dir.empty()) usage("--save-every needs --save DIR");
  if (!a.resume_dir.empty() && !a.init_from.empty()) usage("--resume and --init-from exclude each other");
  if (!a.resume_tag.empty() && a.resume_dir.empty()) usage("--tag needs --resume DIR");
  if (a.model.d_model % a.model.n_head) usage("--d-model must be divisible by --heads");
  return a;
}

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The CPU time this process has used so far (user and system, all its
// threads), in ms: with one compute thread per rank, a step's against its
// wall time says about how long the rank waited for its peers (a lane's
// polling counts as CPU).
double cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto ms = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

// How long this process has run, in ms: from its start as the kernel
// records it (/proc/self/stat's starttime, clock ticks since boot) to now,
// so it counts the loader and libtorch's static initialisers too.
// bench/peer_gpt.py measures the peers the same way (time to first step).
double process_age_ms() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0.0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {  // fields 3..22; starttime is 22
  }
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (now.tv_sec + now.tv_nsec * 1e-9 - std::stod(field) / ticks) * 1000.0;
}

// zero_cpp.cpu_allocator "caching": how its large blocks were served.
nlohmann::json large_blocks_json() {
  const zero::memory::LargeBlockCacheStats s = zero::memory::cpu_large_block_stats();
  return {{"allocator", zero::to_string(zero::memory::current_cpu_allocator())},
          {"hits", s.hits},
          {"maps", s.maps},
          {"unmaps", s.unmaps},
          {"resizes", s.resizes},  // misses served by a cached block's pages
          {"peak_mapped_bytes", s.peak_mapped_bytes},
          // Shared buffers made in a backward from a freed one's pages: stage 3's
          // grad buffers, a collective's scratch (memory/shared_arena.h).
          {"shared_buffer_reuses", zero::memory::shared_arena_stats().kept_reuses},
          // Stage 3's gathers into the pages of the unit released before them
          // (memory/page_buffer.h hold_pages).
          {"unit_page_handoffs", zero::memory::page_handoffs()}};
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// This process's proportional share of its resident memory (PSS): pages it
// shares with the other ranks -- the flat buffers they read in place --
// count 1/n to each of the n mapping them, so the ranks' PSS adds up to
// the host's use, where their RSS counts shared pages once per rank. The
// kernel keeps no peak of it: sampled at a step's end (pss_sampled_at).
int64_t pss_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string key;
  int64_t kib = 0;
  while (rollup >> key) {
    if (key == "Pss:") {
      rollup >> kib;
      return kib * 1024;
    }
    rollup.ignore(1 << 12, '\n');
  }
  return 0;
}

// The steps whose end samples PSS: the first three (allocation settles),
// every tenth, and the last. Reading it walks every mapped page
// (smaps_account: 3% of the 3.3M GPT's step at 4 ranks when read after
// every step, bench/profile.sh).
bool pss_sampled_at(int64_t step, int64_t last) { return step <= 3 || step % 10 == 0 || step == last; }

// Peak bytes the device's caching allocator handed out (0 on the CPU).
int64_t peak_device_bytes(at::Device device) { return zero::memory::device_peak_allocated_bytes(device).value_or(0); }

json comm_json(const zero::comm::OpCounts& counts) {
  json j = json::object();
  for (const auto& [op, c] : counts)
    j[op] = {{"calls", c.calls}, {"bytes", c.bytes}, {"wire_bytes", c.wire_bytes}, {"transport", c.calls_by_transport},
             {"transport_bytes", c.bytes_by_transport}};
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    auto config = zero::Config::from_file(args.config);
    // A DeepSpeed config may leave the optimizer to the training script;
    // this script's choice is AdamW at DeepSpeed's default hyperparameters.
    const bool default_optimizer = !config.optimizer.given;
    if (default_optimizer) {
      config.optimizer.given = true;
      config.optimizer.type = zero::OptimizerType::AdamW;
    }
    auto world = zero::init_distributed();
    const double age_rendezvous_ms = process_age_ms();
    const bool lead = world->rank() == 0;
    auto corpus = zero::data::ByteCorpus::load(args.data);
    std::shared_ptr<zero::comm::Group> dp = world->split(world->size(), "dp");
    at::Device device = at::kCPU;
    if (args.device == "cuda") {
      // The rank's device, set by init_distributed: GPU LOCAL_RANK mod the
      // GPUs visible (more local ranks than GPUs share them through the CUDA
      // IPC transport; NCCL refuses two ranks on one GPU).
      device = world->device();
      if (!device.is_cuda())
        throw std::invalid_argument("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?), or this "
                                    "build of libtorch has no CUDA");
    }
    const auto build_start = std::chrono::steady_clock::now();
    zero::train::GptTrainer trainer(args.model, config, corpus, args.seed, world->comm(), dp, true, device);
    const double build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start).count();
    auto& engine = trainer.engine();
    trainer.set_backward_chunks(args.backward_chunks, args.coalesce);
    json resumed_record;
    if (!args.init_from.empty()) engine.load_weights(args.init_from);
    if (!args.resume_dir.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      trainer.resume(args.resume_dir, args.resume_tag);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (lead)
        std::fprintf(stderr, "resumed from %s%s%s at step %lld (%.0f ms)\n", args.resume_dir.c_str(),
                     args.resume_tag.empty() ? "" : ", tag ", args.resume_tag.c_str(),
                     static_cast<long long>(trainer.steps_done()), ms);
      resumed_record = {{"event", "resume"}, {"step", trainer.steps_done()}, {"load_ms", ms}};
    }

    std::unique_ptr<std::ofstream> log;
    if (!args.log_json.empty() && (lead || args.log_all)) {
      std::string path = args.log_all ? args.log_json + ".rank" + std::to_string(world->rank()) : args.log_json;
      log = std::make_unique<std::ofstream>(path);
      if (!*log) throw std::runtime_error("cannot write " + path);
    }
    auto emit = [&](const json& j) {
      if (log) *log << j.dump() << "\n" << std::flush;
    };
    if (lead) {
      if (default_optimizer)
        std::fprintf(stderr, "no \"optimizer\" in %s: using AdamW (lr %.0e, DeepSpeed's defaults)\n",
                     args.config.c_str(), config.optimizer.lr);
      std::fprintf(stderr, "%s\n%s\ndata: %s (%lld bytes)\n", args.model.describe().c_str(),
                   engine.describe().c_str(), corpus.source().c_str(), static_cast<long long>(corpus.size()));
    }
    emit({{"event", "setup"},
          {"n_params", engine.num_params()},
          {"build_ms", build_ms},  // the model built (under zero::Init at stage 3) and the engine set up
          // The host's high-water mark so far: with the units drawn on the
          // device (zero::defer_init) it stays far below the model's size.
          {"peak_rss_bytes", peak_rss_bytes()},
          {"world_size", world->size()},
          {"dp_size", dp->size()},
          {"rank", world->rank()},
          {"stage", config.zero.stage},
          {"dtype", zero::to_string(config.param_dtype())},
          {"model", {{"layers", args.model.n_layer}, {"d_model", args.model.d_model}, {"heads", args.model.n_head},
                     {"seq", args.model.seq_len}, {"vocab", args.model.vocab}, {"tied_head", args.model.tied_head}}},
          {"data", corpus.source()},
          {"config", config.to_json()}});
    if (!resumed_record.is_null()) emit(resumed_record);

    // Progress: one line per report. The engine reports every
    // steps_per_print steps (none when unset, DeepSpeed's default); its line
    // is replaced by this one (the loss is the same: the global mean over
    // the steps since the last report), with the step count, the step time
    // and the time left. zero-train adds a line of its own at the first and
    // the last step when the engine does not report them (that step's loss).
    const auto start = std::chrono::steady_clock::now();
    const int64_t first_step = trainer.steps_done() + 1;  // > 1 after --resume
    const auto now_ms = [&] {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    zero::train::ProgressTimer timer(0.0, first_step - 1);
    // `window`: the steps the loss is a mean of (the engine's report);
    // the time is per step since the last line, whoever printed it.
    auto progress_line = [&](int64_t s, double loss, int64_t window, double lr, double tokens_per_s, bool skipped) {
      const auto t = timer.line(now_ms(), s, args.steps);
      char mean[48] = "";
      if (window > 1) std::snprintf(mean, sizeof mean, " (mean of %lld steps)", static_cast<long long>(window));
      std::fprintf(stderr, "step %5lld/%lld  loss %.4f%s  lr %.2e  %s%.0f tok/s  %.0f ms/step  ETA %.0f s\n",
                   static_cast<long long>(s), static_cast<long long>(args.steps), loss, mean, lr,
                   skipped ? "(skipped: overflow)  " : "", tokens_per_s, t.ms_per_step, t.eta_s);
    };
    // The engine's loss is the mean of what was given to engine.backward:
    // with --backward-chunks K each chunk's loss / K (the trainer's sum of
    // them is the micro-batch loss), so K times it is the batch's mean.
    engine.on_progress([&](const zero::Progress& p) {
      progress_line(p.step, p.loss * static_cast<double>(args.backward_chunks), p.window_steps, p.lr, p.tokens_per_s,
                    p.skipped);
    });
    std::vector<double> step_ms, wall_ms;
    const double age_ready_ms = process_age_ms();  // model built, engine set up, weights loaded
    double age_first_step_ms = 0.0;
    int64_t peak_pss = 0;
    double last_loss = 0.0;
    zero::comm::OpCounts last_comm;
    for (int64_t s = first_step; s <= args.steps; ++s) {
      const auto step_start = std::chrono::steady_clock::now();
      auto r = trainer.train_step();
      // step_ms stops when the engine's step returns: on a GPU its last
      // kernels may still run. train_step ends by reading the loss back
      // (a device sync), so this wall time holds the whole step.
      const double wall =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start).count();
      if (s == first_step) age_first_step_ms = process_age_ms();
      const int64_t pss = pss_sampled_at(s, args.steps) ? pss_bytes() : -1;
      peak_pss = std::max(peak_pss, pss);
      json record = {{"event", "step"},
            {"step", r.step},
            {"loss", r.loss},
            {"lr", r.lr},
            {"loss_scale", r.loss_scale},
            {"skipped", !r.stepped},
            {"grad_norm", engine.last_grad_norm()},
            {"step_ms", r.step_ms},
            {"wall_ms", wall},
            {"tokens_per_s", r.tokens_per_s},
            {"peak_rss_bytes", peak_rss_bytes()},
            {"minor_faults", minor_faults()},  // this rank's so far: a step's are the difference
            {"cpu_ms", cpu_ms()},              // ditto
            {"model_state_bytes", r.model_state_bytes},
            {"comm", comm_json(r.comm)}};
      if (pss >= 0) record["pss_bytes"] = pss;
      // wall_clock_breakdown: where the step's time went (engine.last_step_times()).
      if (const auto times = engine.last_step_times(); !times.empty()) record["times_ms"] = times;
      emit(record);
      if (!args.save_dir.empty() && ((args.save_every && s % args.save_every == 0) || s == args.steps)) {
        const auto t0 = std::chrono::steady_clock::now();
        trainer.save(args.save_dir);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        int64_t bytes = 0;
        for (const auto& f : std::filesystem::directory_iterator(args.save_dir + "/step" + std::to_string(s)))
          bytes += static_cast<int64_t>(f.file_size());
        emit({{"event", "checkpoint"}, {"step", s}, {"save_ms", ms}, {"bytes", bytes}});
      }
      step_ms.push_back(r.step_ms);
      wall_ms.push_back(wall);
      last_loss = r.loss;
      last_comm = r.comm;
      const int64_t every = config.steps_per_print;  // 0: the engine does not report
      if (lead && (s == first_step || s == args.steps) && !(every > 0 && s % every == 0))
        progress_line(s, r.loss, 1, r.lr, r.tokens_per_s, !r.stepped);
    }
    // One closing record for scripts and benchmarks: the median step time
    // leaves out the first two steps (allocation and warm-up).
    auto steady_median = [](const std::vector<double>& ms) {
      std::vector<double> steady(ms.begin() + std::min<size_t>(2, ms.size() / 2), ms.end());
      std::sort(steady.begin(), steady.end());
      return steady.empty() ? 0.0 : steady[steady.size() / 2];
    };
    const double median_ms = steady_median(step_ms);
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& b = engine.batch();
    // What stage 0 would hold per rank: each part this stage partitions
    // (optimizer state and fp32 masters from stage 1, grads from 2, params
    // at 3) summed over the ranks, the rest as this rank holds it. A
    // collective: every rank takes part. (Stage 3's persistent params, kept
    // whole on every rank, are counted once per rank: a slight overestimate.)
    const zero::StateBytes mine = engine.state_bytes();
    at::Tensor parts = at::tensor({static_cast<double>(mine.params), static_cast<double>(mine.grads),
                                   static_cast<double>(mine.master), static_cast<double>(mine.optimizer)},
                                  at::kDouble);
    world->comm().all_reduce(*dp, parts, zero::comm::ReduceOp::Sum)->wait();
    const int stage = config.zero.stage;
    const double stage0_bytes = (stage >= 3 ? parts[0].item<double>() : mine.params) +
                                (stage >= 2 ? parts[1].item<double>() : mine.grads) +
                                (stage >= 1 ? parts[2].item<double>() + parts[3].item<double>()
                                            : static_cast<double>(mine.master + mine.optimizer));
    const int64_t steps_run = args.steps - first_step + 1;
    const double tokens_per_s_overall =
        train_s > 0 ? static_cast<double>(steps_run * b.train_batch_size * args.model.seq_len) / train_s : 0.0;
    if (lead && steps_run > 0) {
      const double mb = 1024.0 * 1024.0;
      std::fprintf(stderr,
                   "summary: %lld steps in %.1f s, %.0f tokens/s (all ranks), final loss %.4f\n"
                   "         peak RSS %.0f MB (rank 0); model state per rank %.1f MB at stage %d, %.1f MB at stage "
                   "0 (%.1fx)\n",
                   static_cast<long long>(steps_run), train_s, tokens_per_s_overall, last_loss,
                   peak_rss_bytes() / mb, mine.total() / mb, stage, stage0_bytes / mb,
                   mine.total() > 0 ? stage0_bytes / mine.total() : 0.0);
    }
    emit({{"event", "summary"},
          {"steps", args.steps},
          {"final_loss", last_loss},
          {"median_step_ms", median_ms},
          {"median_wall_ms", steady_median(wall_ms)},  // the same over "wall_ms": device-synchronized
          {"tokens_per_s", median_ms > 0 ? b.train_batch_size * args.model.seq_len / (median_ms / 1000.0) : 0.0},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"peak_pss_bytes", peak_pss},  // the largest step-end sample
          {"peak_gpu_bytes", peak_device_bytes(device)},
          {"model_state_bytes", mine.total()},
          {"model_state_bytes_stage0", static_cast<int64_t>(stage0_bytes)},  // the same model at stage 0 (above)
          {"nvme_state_bytes", mine.nvme},  // offload_optimizer "nvme": in the swap file
          {"wall_s", train_s},
          {"skipped_steps", engine.skipped_steps()},
          {"backward_chunks", args.backward_chunks},
          {"coalesce", args.coalesce},
          {"last_step_comm", comm_json(last_comm)},
          {"minor_faults", minor_faults()},  // this rank's, over the whole run
          {"cpu_ms", cpu_ms()},              // ditto
          // This process's age at the rendezvous's end, when ready to step,
          // after the first step (bench/first_step.sh).
          {"process_age_ms", {{"rendezvous", age_rendezvous_ms}, {"ready", age_ready_ms},
                              {"first_step", age_first_step_ms}}},
          {"large_blocks", large_blocks_json()}});
    world->shutdown();  // communicators go while CUDA is up (the World's destructor would too)
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-train: %s\n", e.what());
    return 1;
  }
}

#include "engine/training_log.h"

#include <sys/resource.h>
#include <system_error>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>

namespace zero {

namespace {

constexpr const char* kPhaseNames[] = {"forward", "backward", "backward_allreduce", "step", "step_allgather"};

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

double per_second(int64_t count, double seconds) { return seconds > 0 ? static_cast<double>(count) / seconds : 0.0; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

TrainingLog::TrainingLog(const Config& config, bool lead, std::function<void(const std::string&)> print)
    : steps_per_print_(config.steps_per_print),
      wall_clock_(config.wall_clock_breakdown),
      lead_(lead),
      print_(std::move(print)),
      csv_every_step_(config.csv_monitor.enabled) {
  if (config.csv_monitor.enabled && lead_) {
    // DeepSpeed's layout: output_path/job_name/<event with / as _>.csv.
    csv_dir_ = (std::filesystem::path(config.csv_monitor.output_path) / config.csv_monitor.job_name).string();
    std::error_code ec;
    std::filesystem::create_directories(csv_dir_, ec);
    if (ec) throw std::runtime_error("csv_monitor: cannot create " + csv_dir_ + ": " + ec.message());
  }
}

std::map<std::string, double> TrainingLog::last_step_times() const {
  std::map<std::string, double> out;
  if (wall_clock_)
    for (int p = 0; p < kPhases; ++p) out[kPhaseNames[p]] = last_step_ms_[p];
  return out;
}

bool TrainingLog::prints(int64_t global_steps) const {
  return steps_per_print_ > 0 && global_steps % steps_per_print_ == 0;  // 0: never (DeepSpeed's null)
}

bool TrainingLog::reports(int64_t global_steps) const {
  return csv_every_step_ || prints(global_steps);  // alike on every rank
}

void TrainingLog::on_step(const StepReport& s) {
  if (!csv_dir_.empty()) {
    write_csv("Train/Samples/train_loss", s.global_samples, s.loss);
    write_csv("Train/Samples/lr", s.global_samples, s.lr);
    if (s.loss_scale != 1.0) write_csv("Train/Samples/loss_scale", s.global_samples, s.loss_scale);
    if (wall_clock_)
      for (int p = 0; p < kPhases; ++p)
        write_csv(std::string("Train/Samples/elapsed_time_ms_") + kPhaseNames[p], s.global_samples, last_step_ms_[p]);
  }
  if (!prints(s.global_steps)) return;
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - window_start_).count();
  if (lead_ && progress_) {
    Progress p;
    p.step = s.global_steps;
    p.loss = s.loss;
    p.window_steps = window_steps_;
    p.lr = s.lr;
    p.loss_scale = s.loss_scale;
    p.grad_norm = s.grad_norm;
    p.skipped = s.skipped;
    p.samples_per_s = per_second(s.global_samples - window_first_samples_, seconds);
    p.tokens_per_s = s.global_tokens > 0 ? per_second(s.global_tokens - window_first_tokens_, seconds) : 0.0;
    p.peak_rss_mb = peak_rss_mb();
    progress_(p);
  }
  if (lead_ && print_) {
    if (!progress_) {
      std::string line = "step=" + std::to_string(s.global_steps) + ", loss=" + fmt("%.4f", s.loss) +
                         ", lr=" + fmt("%.3e", s.lr) + ", loss_scale=" + fmt("%g", s.loss_scale) +
                         ", grad_norm=" + fmt("%.4g", s.grad_norm) + (s.skipped ? ", skipped" : "") +
                         ", samples/s=" + fmt("%.1f", per_second(s.global_samples - window_first_samples_, seconds)) +
                         (s.global_tokens > 0 ? ", tokens/s=" + fmt("%.0f", per_second(s.global_tokens - window_first_tokens_, seconds)) : "") +
                         ", peak_rss_mb=" + fmt("%.0f", peak_rss_mb());
      print_(line);
    }
    if (wall_clock_) {
      std::string t = "time (ms, per step) |";
      for (int p = 0; p < kPhases; ++p)
        t += std::string(" ") + kPhaseNames[p] + ": " + fmt("%.2f", window_ms_[p] / static_cast<double>(window_steps_)) +
             (p + 1 < kPhases ? " |" : "");
      print_(t);
    }
  }
  window_ms_.fill(0);
  window_steps_ = 0;
  window_start_ = now;
  window_first_samples_ = s.global_samples;
  window_first_tokens_ = s.global_tokens;
}

void TrainingLog::write_csv(const std::string& event, int64_t x, double value) {
  std::string file = event;
  std::replace(file.begin(), file.end(), '/', '_');
  std::replace(file.begin(), file.end(), ' ', '_');
  const std::string path = csv_dir_ + "/" + file + ".csv";
  const bool first = std::find(csv_started_.begin(), csv_started_.end(), file) == csv_started_.end();
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error("csv_monitor: cannot write " + path);
  if (first) {
    csv_started_.push_back(file);
    out << "step," << event.substr(event.rfind('/') + 1) << "\n";
  }
  // The shortest text that reads back as the same double (Python's repr,
  // which DeepSpeed's monitor writes), not ostream's 6 digits.
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out << x << "," << std::string_view(text, static_cast<size_t>(end - text)) << "\n";
}

}  // namespace zero

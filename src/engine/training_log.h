// What the engine reports while it trains, as DeepSpeed's engine does:
// a progress line every steps_per_print optimizer steps (step, loss as the
// mean over ranks, lr, loss scale, grad norm, samples/s, tokens/s when
// tokens are counted, peak RSS), the
// wall_clock_breakdown timers (forward, backward, its reduction wait, step,
// its all-gather; ms per optimizer step), and csv_monitor's files (one CSV
// per event, DeepSpeed's names and layout). Printing and files are rank 0's;
// the engine computes the global loss on every rank (a collective).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "zero/config.h"
#include "zero/engine.h"

namespace zero {

class TrainingLog {
 public:
  // DeepSpeed's timer names, in its order.
  enum Phase { Forward, Backward, BackwardReduce, Step, StepGather, kPhases };

  struct StepReport {
    int64_t global_steps;    // after this step
    int64_t global_samples;  // samples trained on so far, all ranks
    int64_t global_tokens;   // tokens counted so far (engine.count_tokens), all ranks
    double loss;             // mean over ranks and micro-steps
    double lr, loss_scale, grad_norm;
    bool skipped;
  };

  TrainingLog(const Config& config, bool lead, std::function<void(const std::string&)> print);

  void add_time(Phase phase, double ms) { step_ms_[phase] += ms; }
  // The clock the timers read. With wall_clock_breakdown on a device, the
  // device is synchronised first (as DeepSpeed's synchronized timers do), so
  // a phase holds its kernels, not only their launches.
  std::chrono::steady_clock::time_point now() const {
    if (wall_clock_ && device_sync_) device_sync_();
    return std::chrono::steady_clock::now();
  }
  // Set by the engine on a device: how now() synchronises it.
  void set_device_sync(std::function<void()> sync) { device_sync_ = std::move(sync); }
  // The timers of the last optimizer step, ms by DeepSpeed's names (the
  // forward and backward of its micro-steps, their reduction wait, the
  // update and its all-gather); empty without wall_clock_breakdown.
  std::map<std::string, double> last_step_times() const;
  // Whether the step that makes `global_steps` reports (so the engine
  // computes the global loss on every rank).
  bool reports(int64_t global_steps) const;
  // Whether that step prints a progress line (steps_per_print; never when 0).
  bool prints(int64_t global_steps) const;
  void on_step(const StepReport& s);
  // Every optimizer step, reported or not (before on_step): the window's
  // step count (the progress line's mean and the timers' per-step average
  // divide by it) and its times.
  void count_step() {
    ++window_steps_;
    for (int p = 0; p < kPhases; ++p) window_ms_[p] += step_ms_[p];
    last_step_ms_ = step_ms_;
    step_ms_.fill(0);
  }
  // Set: called with each report instead of printing its line (Engine::on_progress).
  void set_progress(std::function<void(const Progress&)> fn) { progress_ = std::move(fn); }

  // Times a scope into `phase`.
  class Timer {
   public:
    Timer(TrainingLog& log, Phase phase) : log_(log), phase_(phase), t0_(log.now()) {}
    ~Timer() { log_.add_time(phase_, std::chrono::duration<double, std::milli>(log_.now() - t0_).count()); }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;

   private:
    TrainingLog& log_;
    Phase phase_;
    std::chrono::steady_clock::time_point t0_;
  };

 private:
  void write_csv(const std::string& event, int64_t x, double value);

  int64_t steps_per_print_;
  bool wall_clock_;
  bool lead_;
  std::function<void(const std::string&)> print_;
  std::function<void(const Progress&)> progress_;
  bool csv_every_step_;  // csv_monitor on: every step reports (on every rank)
  std::string csv_dir_;  // rank 0 with csv_monitor on: where the files go
  std::vector<std::string> csv_started_;
  std::array<double, kPhases> step_ms_{};        // since the last optimizer step
  std::array<double, kPhases> last_step_ms_{};   // the last optimizer step's
  std::array<double, kPhases> window_ms_{};      // since the last print
  std::function<void()> device_sync_;
  int64_t window_steps_ = 0;
  std::chrono::steady_clock::time_point window_start_ = std::chrono::steady_clock::now();
  int64_t window_first_samples_ = 0;  // global samples when the window began
  int64_t window_first_tokens_ = 0;
};

}  // namespace zero

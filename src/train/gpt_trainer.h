// One optimizer step of the bundled GPT under the engine: the loop behind
// zero-train, shared with the parity tests so they check exactly what users run.
#pragma once

#include <memory>
#include <string>

#include "data/byte_corpus.h"
#include "models/gpt.h"
#include "zero/comm.h"
#include "zero/engine.h"

namespace zero::train {

struct StepRecord {
  int64_t step = 0;          // 1-based optimizer step
  double loss = 0.0;         // mean over the whole global batch (averaged across DP ranks)
  double lr = 0.0;           // lr this step used
  double loss_scale = 1.0;   // scale this step's backward used
  bool stepped = false;      // false: skipped (fp16/bf16 overflow)
  double step_ms = 0.0;
  double tokens_per_s = 0.0;  // global tokens / step time
  int64_t model_state_bytes = 0;
  comm::OpCounts comm;        // this step's collectives (the loss average excluded)
};

class GptTrainer {
 public:
  // Seeds the global RNG with `seed` before building the model, so every
  // rank (and every world size) starts from the same weights. At stage 3 the
  // model is built inside zero::Init unless `zero_init` is false.
  // The model trains on `device` (moved there whole before the engine is
  // built; batches follow).
  GptTrainer(const models::GPTConfig& model_config, const Config& config, const data::ByteCorpus& corpus,
             uint64_t seed, comm::Comm& comm, std::shared_ptr<comm::Group> dp, bool zero_init = true,
             at::Device device = at::kCPU);

  StepRecord train_step();

  // Splits each micro-batch into `chunks` equal parts, one forward and
  // backward each (as GradCache-style losses do), inside
  // engine.coalesce_grad_reduction() when `coalesce`. The micro-batch must
  // divide by `chunks`.
  void set_backward_chunks(int64_t chunks, bool coalesce);

  // Checkpoints with the data position (the step count; batches are a
  // function of step and seed). resume() loads `tag` ("" = latest, as
  // DeepSpeed's load_checkpoint) and checks the seed matches.
  void save(const std::string& dir);  // tag "step<N>"
  void resume(const std::string& dir, const std::string& tag = "");

  Engine& engine() { return *engine_; }
  models::GPT& model() { return model_; }
  int64_t steps_done() const { return step_; }

 private:
  const data::ByteCorpus& corpus_;
  uint64_t seed_;
  comm::Comm& comm_;
  std::shared_ptr<comm::Group> dp_;
  at::Device device_;
  models::GPT model_;
  std::unique_ptr<Engine> engine_;
  int64_t step_ = 0;
  int64_t backward_chunks_ = 1;
  bool coalesce_ = false;
};

}  // namespace zero::train

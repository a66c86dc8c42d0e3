#include "train/gpt_trainer.h"

#include <chrono>
#include <optional>
#include <stdexcept>

#include <ATen/core/grad_mode.h>

#include "common/fault_injection.h"
#include "zero/init.h"

namespace zero::train {

namespace {

models::GPT build_model(const models::GPTConfig& c, uint64_t seed, const Config& config, comm::Comm& comm,
                        std::shared_ptr<comm::Group> dp, bool zero_init, at::Device device) {
  at::manual_seed(seed);
  if (!zero_init) return models::GPT(c);
  // Stage 3: each block is sharded onto `device` as soon as it is built; else a no-op.
  Init init(comm, dp, config, device);
  return models::GPT(c);
}

}  // namespace

GptTrainer::GptTrainer(const models::GPTConfig& model_config, const Config& config, const data::ByteCorpus& corpus,
                       uint64_t seed, comm::Comm& comm, std::shared_ptr<comm::Group> dp, bool zero_init,
                       at::Device device)
    : corpus_(corpus), seed_(seed), comm_(comm), dp_(dp), device_(device),
      model_(build_model(model_config, seed, config, comm, dp, zero_init, device)) {
  if (!device_.is_cpu()) model_->to(device_);
  engine_ = std::make_unique<Engine>(*model_, config, comm, dp);
  // Test-only (common/fault_injection.h): the "backward" fault point, mid-backward,
  // when the first block's grads arrive (the later block's are in by then).
  if (fault::armed("backward"))
    if (auto* w = model_->named_parameters().find("h0.mlp_proj.weight"))
      w->register_hook([](const at::Tensor&) { fault::point("backward"); });
}

void GptTrainer::set_backward_chunks(int64_t chunks, bool coalesce) {
  const int64_t micro = engine_->batch().micro_batch_per_gpu;
  if (chunks < 1 || micro % chunks)
    throw std::invalid_argument("backward chunks: the micro-batch (" + std::to_string(micro) +
                                ") must divide into " + std::to_string(chunks) + " equal chunks");
  backward_chunks_ = chunks;
  coalesce_ = coalesce;
}

void GptTrainer::save(const std::string& dir) {
  engine_->save_checkpoint(dir, "step" + std::to_string(step_),
                           {{"step", step_}, {"seed", seed_}, {"model", model_->config().describe()}});
}

void GptTrainer::resume(const std::string& dir, const std::string& tag) {
  const auto client = engine_->load_checkpoint(dir, tag);
  if (client.value("seed", seed_) != seed_)
    throw std::invalid_argument("resume: the checkpoint in " + dir + " was trained with --seed " +
                                std::to_string(client.value("seed", seed_)) + ", this run has " +
                                std::to_string(seed_) + " (the data order would differ)");
  step_ = client.value("step", int64_t{0});
}

StepRecord GptTrainer::train_step() {
  const auto& b = engine_->batch();
  const int64_t seq = model_->config().seq_len;
  const int dp_rank = dp_->rank(), dp_size = dp_->size();
  StepRecord r;
  r.step = ++step_;
  r.lr = engine_->lr();
  r.loss_scale = engine_->loss_scale();
  const auto comm_before = comm_.counters().totals();
  const auto t0 = std::chrono::steady_clock::now();

  const auto offsets = corpus_.step_offsets(step_, b.train_batch_size, seq, seed_);
  at::Tensor loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
  const int64_t skipped_before = engine_->skipped_steps();
  for (int64_t j = 0; j < b.gradient_accumulation_steps; ++j) {
    const int64_t begin = data::micro_batch_begin(j, dp_rank, dp_size, b.micro_batch_per_gpu);
    std::vector<int64_t> mine(offsets.begin() + begin, offsets.begin() + begin + b.micro_batch_per_gpu);
    auto tokens =
        at::tensor(corpus_.windows(mine, seq), at::kLong).view({b.micro_batch_per_gpu, seq + 1}).to(device_);
    auto x = tokens.narrow(1, 0, seq), y = tokens.narrow(1, 1, seq);
    const int64_t rows = b.micro_batch_per_gpu / backward_chunks_;
    {
      std::optional<Engine::CoalesceGradReduction> coalesced;
      if (coalesce_) coalesced.emplace(*engine_);
      for (int64_t c = 0; c < backward_chunks_; ++c) {
        // Equal chunks: the mean of chunk means is the micro-batch mean.
        auto loss = engine_->forward([&] {
          fault::point("forward");  // test-only (common/fault_injection.h), as "step" below
          return model_->loss(x.narrow(0, c * rows, rows), y.narrow(0, c * rows, rows));
        }) / static_cast<double>(backward_chunks_);
        engine_->count_tokens(rows * seq);
        loss_sum += engine_->backward(loss).detach();  // loss / gas
      }
    }
    fault::point("step");  // test-only: before the optimizer step
    engine_->step();
  }
  r.stepped = engine_->skipped_steps() == skipped_before;
  r.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.comm = comm::diff(comm_.counters().totals(), comm_before);
  // The reported loss is the global-batch mean, comparable at any world size.
  comm_.all_reduce(*dp_, loss_sum, comm::ReduceOp::Avg)->wait();
  r.loss = loss_sum.item<double>();
  r.tokens_per_s = b.train_batch_size * seq / (r.step_ms / 1000.0);
  r.model_state_bytes = engine_->state_bytes().total();
  return r;
}

}  // namespace zero::train
